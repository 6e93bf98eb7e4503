"""Integrity checks of a session file or database, read-only: ``durable-harness fsck``.

A check never modifies anything (a torn tail is reported, not quarantined) and never raises
on bad bytes: every problem is a damage item with a byte offset or line number.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from durable_harness.errors import CorruptSession, DurableHarnessError, SessionNotFound
from durable_harness.session.pi import is_pi_header, open_pi_file
from durable_harness.storage import codec
from durable_harness.storage.base import damage
from durable_harness.storage.jsonl import JsonlSessionStore


def fsck_path(path: str) -> dict[str, Any]:
    """Check ``path``: a durable-harness JSONL file, a pi file, a SQLite store (``PATH`` or
    ``sqlite:PATH``), or a JSONL store folder (every session file below it).

    Returns ``{"ok", "damage", "entries", "records", "format"}`` (a folder adds ``files``, one
    result per session file); ``ok`` is True when no damage was found.

    Raises:
        SessionNotFound: nothing exists at ``path``.
    """
    if path.startswith("sqlite:"):
        path = path[len("sqlite:") :]
    elif path.startswith("jsonl:"):
        path = path[len("jsonl:") :]
    if os.path.isdir(path):
        return _fsck_folder(path)
    if not os.path.exists(path):
        raise SessionNotFound(f"nothing to check at {path}", path=path)
    result: dict[str, Any] = {
        "ok": False,
        "damage": [],
        "entries": 0,
        "records": 0,
        "format": "unknown",
        "path": path,
    }
    if not os.path.isfile(path):
        result["damage"].append(damage("missing", f"no file at {path}"))
        return result
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head.startswith(b"SQLite format 3"):
        return _fsck_sqlite(path, result)
    with open(path, "rb") as fh:
        first = fh.readline(1 << 20)
    try:
        header = codec.loads(first)
    except ValueError:
        header = None
    try:
        with open(path, "rb") as fh:
            fh.readline(1 << 20)
            second = fh.readline(1 << 20)
        if is_pi_header(header) and b'"ops"' not in second:
            result["format"] = "pi"
            store: Any = open_pi_file(path)
        else:
            result["format"] = "durable-harness/jsonl"
            store = JsonlSessionStore.open_path(path, write=False)
    except (CorruptSession, DurableHarnessError) as exc:
        result["damage"].append(damage("bad_header", exc.message, offset=0, line=1))
        return result
    try:
        result["entries"] = store.entry_count()
        result["records"] = len(store.records())
        result["damage"] = list(store.damage)
        result["session_id"] = store.session_id
    finally:
        store.close()
    result["ok"] = not result["damage"]
    return result


def _fsck_sqlite(path: str, result: dict[str, Any]) -> dict[str, Any]:
    result["format"] = "sqlite"
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        result["damage"].append(damage("bad_database", str(exc)))
        return result
    try:
        check = conn.execute("PRAGMA integrity_check").fetchall()
        if check != [("ok",)]:
            result["damage"].append(damage("bad_database", "; ".join(r[0] for r in check)[:500]))
        result["entries"] = conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        result["records"] = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        for sid, eid, parent in conn.execute(
            "SELECT e.session_id, e.id, e.parent_id FROM entries e WHERE e.parent_id IS NOT "
            "NULL AND NOT EXISTS (SELECT 1 FROM entries p WHERE p.session_id = e.session_id "
            "AND p.id = e.parent_id)"
        ):
            result["damage"].append(
                damage(
                    "orphan_parent",
                    f"entry {eid} of session {sid} names missing parent {parent}",
                    id=eid,
                )
            )
    except sqlite3.Error as exc:
        result["damage"].append(damage("bad_database", str(exc)))
    finally:
        conn.close()
    result["ok"] = not result["damage"]
    return result


def _fsck_folder(folder: str) -> dict[str, Any]:
    """Check every session file (``*.jsonl``) below a JSONL store folder."""
    files = [fsck_path(str(p)) for p in sorted(Path(folder).rglob("*.jsonl"))]
    damage_items = [{**d, "path": f["path"]} for f in files for d in f["damage"]]
    return {
        "ok": not damage_items,
        "damage": damage_items,
        "entries": sum(f["entries"] for f in files),
        "records": sum(f["records"] for f in files),
        "format": "jsonl-store",
        "path": folder,
        "files": files,
    }
