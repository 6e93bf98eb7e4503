"""The catalogue of a JSONL store: session files under ``root/sessions/<encoded cwd>/``,
listing, lookup by cwd and by exact id (the ``root/ids/<id>`` links), and reading a file's
header without opening the session."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from durable_harness.errors import FormatError, SessionExists, SessionNotFound
from durable_harness.fs import fsync_dir
from durable_harness.ids import SESSION_ID, iso_from_ns
from durable_harness.storage.base import (
    CwdMatcher,
    Durability,
    SessionInfo,
    SessionStore,
    Store,
    unreadable_error,
)
from durable_harness.storage.jsonl.file import SessionFile
from durable_harness.storage.jsonl.framing import NAME_ID, read_header
from durable_harness.storage.jsonl.store import JsonlSessionStore
from durable_harness.storage.oserrors import boundary, storage_boundary
from durable_harness.storage.private import make_private_dirs


def cwd_dir_name(cwd: str) -> str:
    """Encode a working directory as one safe folder name (pi's scheme: ``--a-b-c--``)."""
    return "--" + cwd.strip("/\\").replace("/", "-").replace("\\", "-").replace(":", "-") + "--"


class JsonlStore(Store):
    """Session files under ``root/sessions/<encoded cwd>/<time>_<id>.jsonl``, and for each one
    a symbolic link ``root/ids/<id>`` to it, so an exact id is found without listing the store.

    The links are a hint, never the truth: a link is made after its session file (a crash in
    between leaves a session without one), is not fsynced, and is followed only to a file whose
    header names the same id; whenever the link is missing or wrong, :meth:`resolve` lists the
    store as it always could (``design/storage.md``, "Finding a session by id").
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.spec = f"jsonl:{self.root}"

    @property
    def sessions_dir(self) -> Path:
        return self.root / "sessions"

    @property
    def ids_dir(self) -> Path:
        """The folder of the id links (``root/ids``)."""
        return self.root / "ids"

    def _create(self, header: dict[str, Any], durability: Durability, fresh: bool) -> SessionStore:
        sid, cwd, ts = header["id"], header["cwd"], header["timestamp"]
        if not SESSION_ID.fullmatch(sid):
            raise FormatError(f"session id {sid!r} may hold only letters, digits, '.', '_', '-'")
        if not fresh and any(i.id == sid for i in self.list_sessions()):
            raise SessionExists(f"session {sid} already exists in {self.spec}", session_id=sid)
        folder = self.sessions_dir / cwd_dir_name(cwd)
        with storage_boundary(str(folder)):
            make_private_dirs(folder)
        name = ts.replace(":", "-").replace(".", "-") + f"_{sid}.jsonl"
        SessionFile.create(str(folder / name), header)
        store = JsonlSessionStore.open_path(str(folder / name), durability=durability)
        self._link(sid, folder.name, name)
        return store

    def _link(self, sid: str, folder: str, name: str) -> None:
        """Point ``ids/<sid>`` at ``sessions/<folder>/<name>`` (relative, so the store can be
        moved). Best effort: a link that cannot be made only costs a listing later."""
        link = str(self.ids_dir / sid)
        target = os.path.join(os.pardir, "sessions", folder, name)
        try:
            make_private_dirs(self.ids_dir)
            try:
                os.symlink(target, link)
            except FileExistsError:  # a stale link (a crash after a delete): replace it
                tmp = f"{link}.{os.getpid()}.tmp"
                os.symlink(target, tmp)
                os.replace(tmp, link)
        except OSError:
            pass

    @boundary
    def find_exact(self, session_id: str) -> SessionInfo | None:
        """The row of ``session_id`` through its link ``ids/<id>``: one ``readlink`` and one
        header read (see :meth:`Store.find_exact`). ``None`` when there is no usable link (none,
        dangling, pointing outside ``sessions/<folder>/``, or at a file whose header names
        another id): :meth:`resolve` then lists the store."""
        if not SESSION_ID.fullmatch(session_id):
            return None
        try:
            target = os.readlink(self.ids_dir / session_id)
        except OSError:
            return None
        parts = target.split(os.sep)
        if (
            len(parts) != 4
            or parts[:2] != [os.pardir, "sessions"]
            or not parts[3].endswith(".jsonl")
            or not all(p and p not in (os.curdir, os.pardir) for p in parts[2:])
        ):
            return None
        info = _row(os.path.join(str(self.sessions_dir), parts[2], parts[3]))
        if info is None or info.id != session_id:
            return None
        return _iso_modified(info)

    def _open(
        self, ref: str, write: bool, durability: Durability, break_lease: bool
    ) -> SessionStore:
        path = ref if ref.endswith(".jsonl") and os.path.exists(ref) else self.resolve(ref).path
        return JsonlSessionStore.open_path(
            path, write=write, durability=durability, break_lease=break_lease
        )

    def delete_session(self, session_id: str) -> None:
        """Delete the session file, its lock file and its quarantine side files (see
        :meth:`Store.delete_session`): under the writer lease, then the folder is fsynced."""
        info = self.find_exact(session_id) or next(
            (i for i in self.list_sessions() if i.id == session_id), None
        )
        if info is None:
            raise SessionNotFound(f"no session {session_id} in {self.spec}", ref=session_id)
        with storage_boundary(info.path), JsonlSessionStore.open_path(info.path, write=True):
            folder = os.path.dirname(info.path)
            base = os.path.basename(info.path)
            for name in os.listdir(folder):
                if name == base or name.startswith(base + ".torn-"):
                    os.unlink(os.path.join(folder, name))
            os.unlink(info.path + ".lock")
            fsync_dir(folder)
            try:
                if os.path.basename(os.readlink(self.ids_dir / session_id)) == base:
                    os.unlink(self.ids_dir / session_id)
            except OSError:
                pass  # no link (a session made before links, or the link failed): fine

    @boundary
    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """Every session file under ``sessions/`` (of one cwd by :class:`CwdMatcher`: the
        header's cwd, never the folder name), most recently modified first.

        A file or folder that cannot be read is listed with its ``error``; in a cwd listing only
        when its folder name encodes ``cwd`` (its recorded cwd is unknown). A file that is not a
        durable-harness session (a pi file, a stray ``.jsonl``) is not a session of the store.

        Raises:
            SessionUnreadable: the ``sessions`` folder itself cannot be read.
        """
        match = CwdMatcher(cwd) if cwd is not None else None
        hinted = {cwd_dir_name(s) for s in match.spellings} if match is not None else set()
        out: list[SessionInfo] = []
        for path in _session_files(str(self.sessions_dir), out):
            info = _row(path)
            if info is not None:
                out.append(info)
        if match is not None:
            # a row whose cwd is unknown (unreadable, or a damaged header that lost it) is
            # shown where its folder name points; every other row by its recorded cwd alone
            out = [i for i in out if match(i.cwd) or (not i.cwd and _folder(i) in hinted)]
        out.sort(key=lambda i: -_seconds(i))  # most recent first; an unknown mtime first of all
        return [_iso_modified(i) for i in out]


def _folder(info: SessionInfo) -> str:
    """The name of the cwd folder a catalogue row lies in (an unreadable folder's row is the
    folder itself)."""
    folder = info.path if info.error is not None and not info.id else os.path.dirname(info.path)
    return os.path.basename(folder)


def _seconds(info: SessionInfo) -> float:
    """A row's ``modified`` while listing (seconds since the epoch); unknown: infinity."""
    try:
        return float(info.modified)
    except ValueError:
        return math.inf


def _iso_modified(info: SessionInfo) -> SessionInfo:
    """``info`` with ``modified`` as ISO 8601, the format of the SQLite backend's."""
    seconds = _seconds(info)
    if math.isinf(seconds):
        return info
    return dataclasses.replace(info, modified=iso_from_ns(int(seconds * 1e9)))


def _session_files(sessions_dir: str, out: list[SessionInfo]) -> list[str]:
    """The paths of the ``*.jsonl`` entries of every cwd folder under ``sessions_dir``,
    sorted; a folder that cannot be listed is appended to ``out`` as an unreadable row (id
    ``""``).

    Raises:
        SessionUnreadable: ``sessions_dir`` itself cannot be listed.
    """
    try:
        with os.scandir(sessions_dir) as it:
            folders = sorted(e.path for e in it if e.is_dir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise unreadable_error(sessions_dir, exc) from exc
    found: list[str] = []
    for folder in folders:
        try:
            with os.scandir(folder) as it:
                found += sorted(e.path for e in it if e.name.endswith(".jsonl"))
        except OSError as exc:
            out.append(SessionInfo.unreadable(folder, exc))
    return found


def _row(path: str) -> SessionInfo | None:
    """The catalogue row of the session file at ``path`` (``modified`` in seconds since the
    epoch, as a string), an unreadable row when it cannot be read, or ``None`` when it is gone
    or is not a durable-harness session."""
    try:
        with open(path, "rb") as fh:  # line 1, and line 2 for a damaged line 1
            mtime = os.fstat(fh.fileno()).st_mtime
            header = read_header(path, fh.readline(1 << 20), fh.readline(1 << 20))[0]
    except OSError as exc:
        if not os.path.lexists(path):
            return None  # removed since the folder was listed: no longer a session
        return _unreadable(path, exc)
    if header is None:
        return None
    return SessionInfo(
        id=str(header["id"]),
        cwd=str(header.get("cwd") or ""),
        path=path,
        created=str(header.get("timestamp", "")),
        modified=f"{mtime:.6f}",
        parent_session=header.get("parentSession"),
    )


def _unreadable(path: str, exc: OSError) -> SessionInfo:
    """The row of a session file that raised ``exc``: id from its name, mtime if stat works."""
    match = NAME_ID.search(os.path.basename(path))
    try:
        modified = f"{os.stat(path).st_mtime:.6f}"
    except OSError:
        modified = ""
    return SessionInfo.unreadable(
        path,
        exc,
        session_id=match.group(1) if match else os.path.basename(path).removesuffix(".jsonl"),
        modified=modified,
    )
