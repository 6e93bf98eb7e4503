"""Small builders for storage tests: entries and records as plain dicts (the conformance
suite's, from :mod:`durable_harness.testing.conformance`), and JSONL high-water-mark edits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from durable_harness.errors import StorageError
from durable_harness.storage import SqliteStore, open_store
from durable_harness.testing.conformance import ent, ids, rec, snapshot

__all__ = ["ent", "ids", "outcomes", "rec", "snapshot", "sqlite_store", "unmarked", "with_mark"]


def sqlite_store(folder: Path) -> SqliteStore:
    """A SQLite store in ``folder`` (``s.db``)."""
    store = open_store(f"sqlite:{folder / 's.db'}")
    assert isinstance(store, SqliteStore)
    return store


async def outcomes(calls: dict[str, tuple[Any, list[Any]]]) -> dict[str, Any]:
    """Run each named ``(session, ops)`` call's ``commit_async`` concurrently (so a group
    store groups them); map each name to its seq or to the StorageError it raised."""
    out: dict[str, Any] = {}

    async def one(name: str, session: Any, ops: list[Any]) -> None:
        try:
            out[name] = await session.commit_async(ops)
        except StorageError as exc:
            out[name] = exc

    async with anyio.create_task_group() as tg:
        for name, (session, ops) in calls.items():
            tg.start_soon(one, name, session, ops)
    return out


def unmarked(data: bytes) -> bytes:
    """A JSONL session file's bytes with its high-water mark (line 1, rewritten in place as
    commits become durable) blanked out: what must stay byte-identical."""
    from durable_harness.storage.jsonl import parse_mark

    at, _ = parse_mark(data[: data.find(b"\n")])
    if at is None:
        return data
    return data[:at] + b"?" * 29 + data[at + 29 :]


def with_mark(data: bytes, seq: int) -> bytes:
    """``data`` with its high-water mark set to ``seq``: the mark a file held when only the
    commits up to ``seq`` were durable (to build the file a crash at a later write leaves)."""
    from durable_harness.storage.jsonl import mark_text, parse_mark

    at, _ = parse_mark(data[: data.find(b"\n")])
    assert at is not None, "the file has no high-water mark"
    return data[:at] + mark_text(seq).encode() + data[at + 29 :]
