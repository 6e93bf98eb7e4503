"""Integrity checks of a session file or database, read-only: ``durable-harness fsck``.

A check never modifies anything (a torn tail is reported, not quarantined) and never raises on
bad bytes inside a session: every problem is a damage item naming its kind and location (byte
``offset`` and ``line`` in a file; ``table``, ``id`` and ``seq`` in a database). It is exactly
the list ``recover`` prints (``Snapshot.all_damage``: the store's own scan, ``design/storage.md``,
"Damage", plus the snapshot's lane findings), so the two cannot disagree. What is not a session
or a store at all raises a typed error.

``ok`` is ``False`` whenever any damage is found, a torn tail included (it is harmless once
quarantined, but until a writer opens the file it is still there; ``design/storage.md``);
warnings (``WARNING_KINDS``: text repaired on read, nothing lost) leave it ``True``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Any

from durable_harness.errors import (
    CorruptSession,
    NotASession,
    NotAStore,
    SessionNotFound,
)
from durable_harness.recovery.snapshot import take_snapshot
from durable_harness.session.pi import is_pi_header, open_pi_file, read_head
from durable_harness.storage.base import SessionStore, Store
from durable_harness.storage.damage import WARNING_KINDS, damage
from durable_harness.storage.jsonl import JsonlSessionStore, is_commit_line, is_own_format
from durable_harness.storage.sqlite import SqliteSessionStore, connect_read_only


def fsck_path(path: str) -> dict[str, Any]:
    """Check ``path``: a durable-harness JSONL file, a pi file, a SQLite store (``PATH`` or
    ``sqlite:PATH``; ``sqlite:PATH#ID`` checks one session of it), a PostgreSQL store
    (``postgresql://...``, ``#ID`` likewise), or a JSONL store folder (every session file
    below it).

    Returns ``{"ok", "damage", "entries", "records", "format", "path"}`` (a folder adds
    ``files``, one result per file; a file adds ``session_id``; a database ``sessions``);
    ``ok`` is True when no damage was found.

    Raises:
        SessionNotFound: nothing exists at ``path``, or ``#ID`` names no session.
        NotASession: ``path`` is a file that is not a session file (nor a SQLite database).
        NotAStore: ``path`` is a folder with no ``sessions/`` folder and no session file below
            it, or a SQLite database without the durable-harness tables.
    """
    only: str | None = None
    if path.startswith(("postgresql://", "postgres://")):
        spec, _, only_ref = path.partition("#")
        return _fsck_postgres(spec, only_ref or None)
    if path.startswith("sqlite:"):
        path, _, only_ref = path[len("sqlite:") :].partition("#")
        only = only_ref or None
    elif path.startswith("jsonl:"):
        path = path[len("jsonl:") :]
    if os.path.isdir(path):
        return _fsck_folder(path)
    if not os.path.exists(path):
        raise SessionNotFound(f"nothing to check at {path}", path=path)
    if not os.path.isfile(path):
        raise NotASession(f"{path} is neither a file nor a folder", path=path)
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head.startswith(b"SQLite format 3"):
        return _fsck_sqlite(path, only)
    return _fsck_file(path)


def fsck_session(ref: str, store: Store) -> dict[str, Any]:
    """Check one session of ``store`` named by id or unique id prefix (as the other commands
    take it): its file, or its rows of the database.

    Raises:
        SessionNotFound, AmbiguousSessionPrefix: as :meth:`Store.resolve`.
    """
    if store.spec.startswith(("postgresql://", "postgres://")):
        return _fsck_postgres(store.spec, store.resolve(ref).id)
    return fsck_path(store.resolve(ref).path)


def _fsck_postgres(spec: str, only: str | None) -> dict[str, Any]:
    """Check a PostgreSQL store (every session, or the one ``only`` names by id or prefix),
    read-only: each session's scan (``PostgresSessionStore.scan``; the database enforces
    structure, so what is left to find is listed in ``design/postgres.md``). The result's
    ``path`` names the server without its password.

    Raises:
        StoreNotFound: the database holds no durable-harness store.
        SessionNotFound, AmbiguousSessionPrefix: ``only`` names no single session.
    """
    from durable_harness.storage import open_store

    store = open_store(spec, create=False)
    where = str(getattr(store, "location", "postgresql"))
    result = _result(where, "postgres")
    if only is not None:
        ids = [store.resolve(only).id]
        result["session_id"] = ids[0]
    else:
        ids = sorted(i.id for i in store.list_sessions())
    result["sessions"] = len(ids)
    for sid in ids:
        session = store.open_session(sid, write=False)
        try:
            _add_session(result, sid, session, len(session.records()))
        finally:
            session.close()
    result["ok"] = _ok(result["damage"])
    return result


def _add_session(result: dict[str, Any], sid: str, store: SessionStore, records: int) -> None:
    """Add one session of a database to ``result``: its entries, ``records`` and damage."""
    result["entries"] += store.entry_count()
    result["records"] += records
    result["damage"].extend({**d, "session_id": sid} for d in take_snapshot(store).all_damage())


def damage_location(item: dict[str, Any]) -> str:
    """Where a damage item is, in words: ``offset 120 (line 3)`` or ``seq 7 (records r1)``."""
    if "offset" in item:
        line = f" (line {item['line']})" if "line" in item else ""
        return f"offset {item['offset']}{line}"
    if "line" in item:
        return f"line {item['line']}"
    if "seq" in item:
        where = " ".join(str(item[k]) for k in ("table", "id") if item.get(k) is not None)
        return f"seq {item['seq']}" + (f" ({where})" if where else "")
    if "id" in item:
        return f"id {item['id']}"
    return "unknown location"


def _result(path: str, fmt: str) -> dict[str, Any]:
    return {"ok": False, "damage": [], "entries": 0, "records": 0, "format": fmt, "path": path}


def _fsck_file(path: str) -> dict[str, Any]:
    """Check one session file (ours or pi's).

    Raises:
        NotASession: line 1 is neither a session header nor a commit line, and the file is
            not recognisably ours (see :func:`~durable_harness.storage.jsonl.recover_header`).
    """
    header, pi = read_head(path)
    ours = isinstance(header, dict) and (is_own_format(header) or is_commit_line(header))
    result = _result(path, "pi" if pi else "durable-harness/jsonl")
    if is_pi_header(header) and not pi:  # a pi file with a line that looks like a commit:
        try:  # ours if it opens as ours, else pi's
            return _fill(result, JsonlSessionStore.open_path(path, write=False))
        except CorruptSession:
            result["format"], pi = "pi", True
    store: SessionStore
    try:
        store = open_pi_file(path) if pi else JsonlSessionStore.open_path(path, write=False)
    except CorruptSession as exc:
        if not (ours or is_pi_header(header)):
            raise NotASession(
                f"{path} is not a session file: line 1 is neither a session header nor a "
                "commit line",
                path=path,
            ) from exc
        result["damage"].append(damage("bad_header", exc.message, offset=0, line=1))
        return result
    return _fill(result, store)


def _fill(result: dict[str, Any], store: SessionStore) -> dict[str, Any]:
    try:
        result["entries"] = store.entry_count()
        result["records"] = len(store.records())
        result["damage"] = take_snapshot(store).all_damage()
        result["session_id"] = store.session_id
    finally:
        store.close()
    result["ok"] = _ok(result["damage"])
    return result


def _ok(items: list[dict[str, Any]]) -> bool:
    """No damage but warnings."""
    return all(d.get("kind") in WARNING_KINDS for d in items)


def _fsck_sqlite(path: str, only: str | None) -> dict[str, Any]:
    """Check a SQLite store (every session, or the one whose id is ``only``), read-only: the
    database's own ``integrity_check``, then each session's scan (``SqliteSessionStore.scan``).

    Raises:
        NotAStore: a SQLite database without the durable-harness tables.
        SessionNotFound: ``only`` names no session of the database.
    """
    result = _result(path, "sqlite")
    try:
        conn = connect_read_only(path)
    except sqlite3.Error as exc:
        result["damage"].append(damage("bad_database", f"{path}: {exc}"))
        return result
    try:
        check = conn.execute("PRAGMA integrity_check").fetchall()
        if check != [("ok",)]:
            result["damage"].append(damage("bad_database", "; ".join(r[0] for r in check)[:500]))
        ids = [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id")]
    except sqlite3.Error as exc:
        result["damage"].append(damage("bad_database", f"{path}: {exc}"))
        return result
    finally:
        conn.close()
    if only is not None:
        matches = [i for i in ids if i == only] or [i for i in ids if i.startswith(only)]
        if len(matches) != 1:
            raise SessionNotFound(f"no single session matches {only!r} in {path}", ref=only)
        ids = matches
        result["session_id"] = only
    result["sessions"] = len(ids)
    for sid in ids:
        try:
            store = SqliteSessionStore(
                path,
                sid,
                read_only=True,
                durability="sync",
                lease=None,
                conn=connect_read_only(path),
            )
        except sqlite3.Error as exc:
            result["damage"].append(damage("bad_database", f"session {sid}: {exc}"))
            continue
        try:
            with contextlib.closing(connect_read_only(path)) as conn:
                sql = "SELECT COUNT(*) FROM records WHERE session_id=?"
                _add_session(result, sid, store, int(conn.execute(sql, (sid,)).fetchone()[0]))
        except sqlite3.Error as exc:
            result["damage"].append(damage("bad_database", f"session {sid}: {exc}"))
        finally:
            store.close()
    result["ok"] = _ok(result["damage"])
    return result


def _is_session_file(path: Path) -> bool:
    try:
        header, _ = read_head(str(path))
    except OSError:
        return True  # unreadable: reported by its own check
    return isinstance(header, dict) and (
        is_own_format(header) or is_commit_line(header) or is_pi_header(header)
    )


def _fsck_folder(folder: str) -> dict[str, Any]:
    """Check every session file (``*.jsonl``) below a JSONL store folder.

    Raises:
        NotAStore: the folder has no ``sessions/`` folder and no session file below it.
    """
    paths = sorted(Path(folder).rglob("*.jsonl"))
    if not (Path(folder) / "sessions").is_dir() and not any(_is_session_file(p) for p in paths):
        raise NotAStore(
            f"{folder} is not a session store: no sessions/ folder and no session file below it",
            path=folder,
        )
    files = []
    for p in paths:
        try:
            files.append(fsck_path(str(p)))
        except (NotASession, OSError) as exc:  # a stray file in a store is damage of the store
            item = damage("not_a_session", f"{p}: {exc}", offset=0, line=1)
            files.append({**_result(str(p), "unknown"), "damage": [item]})
    damage_items = [{**d, "path": f["path"]} for f in files for d in f["damage"]]
    return {
        "ok": _ok(damage_items),
        "damage": damage_items,
        "entries": sum(f["entries"] for f in files),
        "records": sum(f["records"] for f in files),
        "format": "jsonl-store",
        "path": folder,
        "files": files,
    }
