"""The storage interface: one session's tree, lanes and lane operation logs under one ``seq``.

Every backend (``memory``, ``jsonl``, ``sqlite``; later ``postgres``) implements
:class:`SessionStore` for one session and :class:`Store` for a catalogue of sessions.

Guarantees a caller can check at the call site:

* :meth:`SessionStore.commit` is atomic: all of its ops become visible and durable together, or
  none does (one JSONL line, one SQL transaction).
* When ``commit`` returns, the ops are durable per the store's :data:`Durability` mode.
* ``seq`` strictly rises across every op of a session, whatever its kind.
* Entries are never edited or deleted; lanes only move their leaf.
* A commit is refused with :class:`~durable_harness.errors.StaleGeneration` once another writer
  has taken the lease, and with :class:`~durable_harness.errors.ReadOnlySession` on a read-only
  open.
"""

from __future__ import annotations

import abc
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.lowlevel
import anyio.to_thread

from durable_harness.errors import (
    AmbiguousSessionPrefix,
    CorruptSession,
    SessionNotFound,
    SessionUnreadable,
    StorageError,
)
from durable_harness.models.header import new_header as new_header  # the backends' import
from durable_harness.storage import codec
from durable_harness.storage.oserrors import guard_class

Durability = Literal["sync", "batch", "none"]
DURABILITY_MODES: tuple[Durability, ...] = ("sync", "batch", "none")


@dataclass(frozen=True)
class EntryOp:
    """Append ``entry`` (a dict with ``type``, ``id``, ``parentId``) to the tree.

    When ``lane`` is set, the lane's leaf moves to this entry in the same commit.
    """

    entry: dict[str, Any]
    lane: str | None = None


@dataclass(frozen=True)
class RecordOp:
    """Append an operation-log ``record`` (``type``, ``id``, ``lane``, ``runId``, ``timestamp``).

    ``run_started`` opens a run on its lane and ``run_finished`` closes it; the store keeps the
    lane's open run in step with these records in the same commit.
    """

    record: dict[str, Any]


_UNSET: Any = object()


@dataclass(frozen=True)
class LaneOp:
    """Create a lane or change it: move its leaf (``leaf_id``; ``None`` means before the root),
    and/or merge ``config`` (model, thinking level, active tools) into its configuration."""

    lane: str
    leaf_id: Any = _UNSET
    config: dict[str, Any] | None = None

    def sets_leaf(self) -> bool:
        """True when this op moves the leaf."""
        return self.leaf_id is not _UNSET


Op = EntryOp | RecordOp | LaneOp


@dataclass
class LaneState:
    """A lane: ``name``, ``leaf_id`` (``None`` before the first entry), ``config``, and the open
    run (``run_id`` and the ``seq`` of its ``run_started`` record) if any."""

    name: str
    leaf_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    run_seq: int | None = None


@dataclass
class SessionInfo:
    """A catalogue row: ``id``, ``cwd`` (as recorded in the session's header), ``path`` (file or
    ``sqlite:PATH#id``), ``created`` and ``modified`` (ISO 8601 for SQLite, seconds since the
    epoch for JSONL), ``name`` if set, ``parent_session``.

    ``error`` is ``None`` for a readable session. A session file (or folder of them) that exists
    but cannot be read is still listed, never left out: ``error`` is then
    ``{"code": "session_unreadable", "errno": "EACCES", "message": ...}``, ``path`` names the
    file, ``id`` comes from the file name (``""`` for a folder) and ``cwd`` is ``""`` (unknown).
    """

    id: str
    cwd: str
    path: str
    created: str
    modified: str
    name: str | None = None
    parent_session: str | None = None
    error: dict[str, Any] | None = None

    @classmethod
    def unreadable(
        cls, path: str, exc: OSError, *, session_id: str = "", modified: str = ""
    ) -> SessionInfo:
        """The row of a session file or folder at ``path`` that raised ``exc`` when read."""
        code = errno_name(exc)
        reason = exc.strerror or str(exc)
        return cls(
            id=session_id,
            cwd="",
            path=path,
            created="",
            modified=modified,
            error={
                "code": "session_unreadable",
                "errno": code,
                "message": f"{path}: cannot be read: {reason} ({code})",
            },
        )


def errno_name(exc: OSError) -> str:
    """The symbolic name of ``exc``'s errno (``EACCES``, ``EIO``...); ``EIO`` when it has none."""
    return errno.errorcode.get(exc.errno, "EIO") if exc.errno else "EIO"


class CwdMatcher:
    """The one rule of session lookup by working directory (``sessions --cwd``,
    ``run --continue``, :meth:`Store.list_sessions` and :meth:`Store.most_recent`).

    A session belongs to the directory ``query`` when the ``cwd`` recorded in its header names
    the same directory: both sides resolved with :func:`os.path.realpath` (symlinks, ``..``,
    repeated slashes), so a project reached through a symlink, or moved behind one after the
    session started, is found under either spelling. Where the recorded directory no longer
    exists, ``realpath`` resolves the part that still exists and keeps the rest as spelled, so
    the literal recorded spelling still finds the session. A recorded cwd that is not an
    absolute path matches only the query spelled the same way; an empty one matches nothing.

    The JSONL folder name (pi's encoding, ``--a-b-c--``) is never consulted: it maps
    ``/r/x/y`` and ``/r/x-y`` to one folder. Each recorded spelling is resolved once per matcher.

    Args:
        query: the working directory asked about (relative to the process's cwd if relative).
    """

    def __init__(self, query: str) -> None:
        self.query = query
        absolute = os.path.abspath(query)
        self.real = os.path.realpath(absolute)
        self.spellings = frozenset({absolute, self.real})
        self._decided: dict[str, bool] = {}

    def __call__(self, recorded: str) -> bool:
        """True when a session whose header records ``recorded`` belongs to the query."""
        hit = self._decided.get(recorded)
        if hit is None:
            hit = self._decided[recorded] = self._decide(recorded)
        return hit

    def _decide(self, recorded: str) -> bool:
        if not recorded:
            return False
        if not os.path.isabs(recorded):
            return recorded == self.query
        return os.path.realpath(recorded) == self.real


def damage(
    kind: str, detail: str, *, offset: int | None = None, line: int | None = None, **extra: Any
) -> dict[str, Any]:
    """Build one damage item ``{kind, detail, offset?, line?, ...}``.

    Kinds (the table with each backend's detection and location fields is in
    ``design/storage.md``): ``torn_tail`` (quarantined), ``bad_line``, ``bad_header``,
    ``missing_header``, ``bad_mark``, ``bad_row``, ``orphan_parent``, ``duplicate_id``,
    ``seq_regression``, ``seq_gap``, ``truncated``, ``stale_generation``; and the warnings in
    :data:`WARNING_KINDS`, which lose nothing. ``offset`` is a byte
    offset into the file; ``line`` is 1-based; SQLite damage names ``table``, ``id``, ``seq``.
    """
    item: dict[str, Any] = {"kind": kind, "detail": detail}
    if offset is not None:
        item["offset"] = offset
    if line is not None:
        item["line"] = line
    item.update(extra)
    return item


WARNING_KINDS = frozenset({"replaced_surrogate"})
"""Damage kinds that are warnings: the entry loaded whole (a lone UTF-16 surrogate read as
U+FFFD), no commit is missing, so they never make a log "damaged" for recovery or fsck. With
``torn_tail`` (never acknowledged, quarantined) these are the kinds a "damaged" test skips."""


def surrogate_warnings(
    raw: bytes, ops: list[Any], *, offset: int | None = None, line: int | None = None
) -> list[dict[str, Any]]:
    """One ``replaced_surrogate`` warning per op of the commit line ``raw`` (already decoded into
    ``ops``) that held a lone UTF-16 surrogate, naming the entry (or record, or lane) and where
    in it the text was; see :func:`durable_harness.storage.codec.loads`."""
    by_op: dict[int, list[str]] = {}
    for path in codec.lone_surrogate_paths(raw):
        if len(path) >= 2 and path[0] == "ops" and isinstance(path[1], int):
            by_op.setdefault(path[1], []).append(codec.format_path(path[3:] or path[2:]))
        else:
            by_op.setdefault(-1, []).append(codec.format_path(path))
    out: list[dict[str, Any]] = []
    for idx, where in sorted(by_op.items()):
        op = ops[idx] if 0 <= idx < len(ops) and isinstance(ops[idx], dict) else {}
        body = op.get("entry") or op.get("record")
        what, oid = (
            (op.get("op"), body.get("id"))
            if isinstance(body, dict)
            else ("lane", op.get("lane"))
            if op
            else ("commit line", None)
        )
        out.append(
            damage(
                "replaced_surrogate",
                f"{what}{'' if oid is None else ' ' + str(oid)}: lone UTF-16 surrogate in "
                f"{', '.join(where)} read as U+FFFD; the file is unchanged",
                offset=offset,
                line=line,
                id=oid,
            )
        )
    return out


def seq_gap_damage(after: int, seq: int, **location: Any) -> dict[str, Any]:
    """A ``seq_gap`` item: the op numbered ``seq`` follows ``after`` with numbers missing between
    (a deleted line or row). ``location`` names where the op after the gap is stored."""
    return damage(
        "seq_gap",
        f"seq jumps from {after} to {seq}: {seq - after - 1} op(s) are missing before it",
        after=after,
        seq=seq,
        missing=seq - after - 1,
        **location,
    )


def truncated_damage(expected: int, found: int, **location: Any) -> dict[str, Any]:
    """A ``truncated`` item: the durable high-water mark says seq ``expected`` was committed
    but the stored ops end at ``found`` (the last commits are gone). ``location`` names where
    the data ends."""
    return damage(
        "truncated",
        f"the high-water mark says seq {expected} was committed but the stored ops end at "
        f"seq {found}: the last {expected - found} op(s) are missing",
        expected=expected,
        found=found,
        **location,
    )


def continuity_damage(
    ops: list[tuple[int, dict[str, Any]]],
    start: int,
    mark: int | None,
    end: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Check that stored seqs run on without a gap: ``ops`` are ``(seq, location)`` pairs in
    the order stored, ``start`` is the seq known to precede the first (0 for a whole session),
    ``mark`` the durable high-water mark (``None`` when the backend keeps none), ``end`` the
    location where the stored data ends (for a ``truncated`` item).

    Returns ``seq_gap`` items (a seq more than one past the one before it; a repeated or falling
    seq is another backend check's ``seq_regression``) and a ``truncated`` item when the last
    seq is below ``mark``. The one continuity rule of every backend.
    """
    out: list[dict[str, Any]] = []
    prev = start
    for seq, location in ops:
        if seq > prev + 1:
            out.append(seq_gap_damage(prev, seq, **location))
        prev = max(prev, seq)
    if mark is not None and prev < mark:
        out.append(truncated_damage(mark, prev, **(end or {})))
    return out


class PendingCommit:
    """One commit waiting in a group-commit queue: its ops, then its outcome (``seq`` or
    ``error``) once ``done``."""

    __slots__ = ("done", "error", "ops", "seq")

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.done = False
        self.seq = 0
        self.error: BaseException | None = None


async def queued_commit(
    queue: list[PendingCommit], ops: list[Op], run: Callable[[list[PendingCommit]], None]
) -> int:
    """Group commit for tasks on one event loop: queue ``ops`` and yield once; the first queued
    task to resume hands the whole queue to ``run`` (which commits it and marks every item
    done), and the others find their outcome when they resume.

    A call cancelled before its ops were taken leaves the queue and is not committed.

    Raises:
        whatever ``run`` recorded as this call's error.
    """
    item = PendingCommit(ops)
    queue.append(item)
    try:
        await anyio.lowlevel.checkpoint()
    except BaseException:
        if not item.done:
            queue.remove(item)
        raise
    if not item.done:
        batch = queue[:]
        queue.clear()
        run(batch)
    if item.error is not None:
        raise item.error
    return item.seq


class SessionStore(abc.ABC):
    """One open session. Not bound to an event loop; thread-safe for concurrent ``commit``.

    Attributes:
        session_id: the session's id (UUIDv7 for sessions created here).
        header: the header dict (``type="session"``, ``version``, ``id``, ``cwd``...).
        read_only: True when opened without the writer lease.
        generation: the lease's fencing generation (0 when read-only).
        durability: the :data:`Durability` mode of commits.
        damage: damage in the stored session (see :func:`damage`), never raised: found on
            open (JSONL), or by a full scan the first time it is read (SQLite). ``fsck`` and
            recovery both read this list.
        location: a human-readable location (file path or ``sqlite:PATH#id``).
    """

    session_id: str
    header: dict[str, Any]
    read_only: bool
    generation: int
    durability: Durability
    damage: list[dict[str, Any]]
    location: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every backend's public methods raise typed errors, never a bare ``OSError`` or
        ``sqlite3.Error`` (the one boundary: :mod:`durable_harness.storage.oserrors`)."""
        super().__init_subclass__(**kwargs)
        guard_class(cls)

    @abc.abstractmethod
    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        """Apply ``ops`` atomically and durably (per :attr:`durability`); return the last seq.

        With ``wait=False`` (``sync`` or ``batch``) the call may return once the commit is
        written, before its fsync; :meth:`wait_durable` makes every earlier commit durable.
        Backends whose commit is its own durability point (SQLite) ignore ``wait``.

        Raises:
            ReadOnlySession: opened read-only.
            StaleGeneration: another writer took the lease since this one was opened.
            IdConflict: an entry or record id is already present.
            UnknownEntry: a parent or leaf names an entry that does not exist.
        """

    @abc.abstractmethod
    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        """Return the entry dict (with its ``seq``) or ``None``."""

    @abc.abstractmethod
    def iter_entries(self, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """Return every entry (or those of ``types``) in ``seq`` order: a full read, for
        listings, facts, fsck and export."""

    @abc.abstractmethod
    def entry_count(self) -> int:
        """Return the number of entries in the tree."""

    @abc.abstractmethod
    def lanes(self) -> dict[str, LaneState]:
        """Return every lane by name (``main`` always exists)."""

    def lane(self, name: str) -> LaneState:
        """Return one lane (an unknown lane is empty). Backends answer it without reading
        every lane: it is on the hot path (each append reads its lane's leaf)."""
        return self.lanes().get(name) or LaneState(name)

    @abc.abstractmethod
    def records(
        self,
        lane: str | None = None,
        *,
        run_id: str | None = None,
        since_seq: int = 0,
        types: tuple[str, ...] | None = None,
    ) -> list[dict[str, Any]]:
        """Return operation-log records in ``seq`` order, filtered by lane, run, seq and type."""

    @abc.abstractmethod
    def last_seq(self) -> int:
        """Return the highest committed seq (0 for an empty session)."""

    def wait_durable(self) -> None:
        """Block until every commit made so far is durable (a no-op unless ``batch``)."""
        return None

    async def wait_durable_async(self) -> None:
        """Await :meth:`wait_durable`: in ``batch`` mode without blocking the event loop."""
        if self.durability == "batch":
            await anyio.to_thread.run_sync(self.wait_durable)
        else:
            self.wait_durable()

    async def commit_async(self, ops: list[Op]) -> int:
        """Commit ``ops`` and await its durability; return the commit's last seq.

        In ``batch`` mode concurrent tasks share fsyncs (group commit); the JSONL and SQLite
        backends go further and share one write or one transaction per group (see theirs).
        A fast fsync may run on the event loop's thread, as a ``sync`` commit's does.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        seq = self.commit(ops, wait=self.durability != "batch")
        await self.wait_durable_async()
        return seq

    def lease_holder(self) -> dict[str, Any] | None:
        """Return ``{"pid", "host", "generation"}`` of the live process holding the writer lease
        (this one included), or ``None`` when no live process holds it."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Flush nothing more, release the lease and close files. Idempotent."""

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store(abc.ABC):
    """A catalogue of sessions grouped by working directory.

    Attributes:
        spec: the store's spec string (``jsonl:DIR`` or ``sqlite:PATH``).
    """

    spec: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """As :meth:`SessionStore.__init_subclass__`: OS and database errors leave typed."""
        super().__init_subclass__(**kwargs)
        guard_class(cls)

    @abc.abstractmethod
    def create_session(
        self,
        cwd: str,
        *,
        session_id: str | None = None,
        parent_session: str | None = None,
        header_extra: dict[str, Any] | None = None,
        durability: Durability = "sync",
    ) -> SessionStore:
        """Create a new empty session (lane ``main``), exclusively, and open it for writing.

        Raises:
            SessionExists: ``session_id`` is already taken.
        """

    @abc.abstractmethod
    def open_session(
        self,
        ref: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> SessionStore:
        """Open a session by id or unique id prefix.

        With ``write=True`` the writer lease is taken (generation bumped); ``break_lease=True``
        takes it even from a live holder, whose later commits then fail with StaleGeneration.

        Raises:
            SessionNotFound, AmbiguousSessionPrefix, LeaseHeld.
        """

    @abc.abstractmethod
    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """Return sessions (of one working directory, or all), most recently modified first.

        With ``cwd``, a session belongs to it by :class:`CwdMatcher` (the recorded cwd, as real
        paths), never by the JSONL folder name. Sessions that cannot be read are listed with
        their ``error`` (see :class:`SessionInfo`); a cwd listing includes those whose folder
        name is the encoding of ``cwd``, since their recorded cwd is unknown.
        """

    def delete_session(self, session_id: str) -> None:
        """Delete one session (by exact id) and everything stored beside it, for good.

        Takes the writer lease first, so a session a live process holds is never deleted.

        Raises:
            SessionNotFound: no session has this id.
            LeaseHeld: a live process holds the session.
            StorageError: the backend cannot delete sessions, or the deletion failed.
        """
        raise StorageError(f"{self.spec} cannot delete sessions", session_id=session_id)

    def resolve(self, ref: str) -> SessionInfo:
        """Find one session by exact id or unique prefix: the exact id first, by the backend's
        own fast path (:meth:`find_exact`: one file or one indexed row, not a listing), then
        every session whose id starts with ``ref`` (:meth:`find_prefixed`). An exact id wins
        over a longer id it prefixes (``design/storage.md``, "Finding a session").

        Raises:
            SessionNotFound: nothing matches.
            AmbiguousSessionPrefix: several match; ``details['candidates']`` lists their ids.
            SessionUnreadable: the one match is a session file that cannot be read.
        """
        hit = self.find_exact(ref) if ref else None
        if hit is not None:
            return _readable(hit)
        matches = self.find_prefixed(ref) if ref else []
        exact = [i for i in matches if i.id == ref]
        if exact:
            return _readable(exact[0])
        if not matches:
            raise SessionNotFound(f"no session matches {ref!r} in {self.where()}", ref=ref)
        if len(matches) > 1:
            ids = sorted(i.id for i in matches)
            raise AmbiguousSessionPrefix(
                f"session prefix {ref!r} is ambiguous: {', '.join(ids)}", ref=ref, candidates=ids
            )
        return _readable(matches[0])

    def where(self) -> str:
        """The store as an error message names it: its spec (a backend whose spec may hold a
        credential names its location instead)."""
        return self.spec

    def find_exact(self, session_id: str) -> SessionInfo | None:
        """The catalogue row of the session whose id is exactly ``session_id``, found without
        listing the store, or ``None`` when this fast path does not find it (then
        :meth:`resolve` asks :meth:`find_prefixed`, which decides). A row may carry an
        ``error`` (a file that cannot be read), as in :meth:`list_sessions`.

        Backends override it (an indexed row, one known file); this default finds nothing.
        """
        return None

    def find_prefixed(self, prefix: str) -> list[SessionInfo]:
        """The catalogue rows whose id starts with ``prefix`` (an exact id included), in any
        order. The default filters :meth:`list_sessions`; database backends ask their index.
        A backend may cap the number of rows (at least two, so ambiguity is still seen)."""
        return [i for i in self.list_sessions() if i.id.startswith(prefix)]

    def most_recent(self, cwd: str) -> SessionInfo | None:
        """Return the most recently modified session of ``cwd`` (see :class:`CwdMatcher`), or
        ``None`` when the directory has none of its own.

        Raises:
            SessionUnreadable: the most recent candidate cannot be read, so whether it is this
                directory's latest session is unknown (it is never skipped silently).
            CorruptSession: the most recent candidate's header is damaged and names no cwd.
        """
        infos = self.list_sessions(cwd)
        if not infos:
            return None
        latest = _readable(infos[0])
        if not latest.cwd:
            raise CorruptSession(
                f"the most recent session file for {cwd}, {latest.path}, has a damaged header "
                f"that names no working directory: pick a session with --session, or run "
                f"`durable-harness fsck {latest.path}`",
                path=latest.path,
                cwd=cwd,
            )
        return latest


_HINT = "check its permissions and the disk, or move it out of the store"


def unreadable_error(path: str, exc: OSError, *, what: str = "cannot be read") -> SessionUnreadable:
    """The :class:`~durable_harness.errors.SessionUnreadable` for ``path``, which raised ``exc``
    when opened or read (returned, for the caller to raise ``from exc``); ``what`` says which."""
    name = errno_name(exc)
    return SessionUnreadable(
        f"{path}: {what}: {exc.strerror or exc} ({name}); {_HINT}", path=path, errno=name
    )


def _readable(info: SessionInfo) -> SessionInfo:
    """``info`` itself, or :class:`~durable_harness.errors.SessionUnreadable` for an error row."""
    if info.error is not None:
        raise SessionUnreadable(
            f"{info.error['message']}; {_HINT}, or pick another session with --session",
            path=info.path,
            errno=info.error["errno"],
        )
    return info
