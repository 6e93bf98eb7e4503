"""Small builders for storage tests: entries and records as plain dicts."""

from __future__ import annotations

from typing import Any

from durable_harness.storage import SessionStore


def ent(eid: str, parent: str | None = None, **extra: Any) -> dict[str, Any]:
    """A ``custom`` entry with a fixed timestamp (storage does not validate entry bodies)."""
    return {
        "type": "custom",
        "customType": "test",
        "id": eid,
        "parentId": parent,
        "timestamp": "2026-01-01T00:00:00.000Z",
        **extra,
    }


def rec(rid: str, rtype: str = "note", lane: str | None = "main", **extra: Any) -> dict[str, Any]:
    """An operation-log record."""
    out: dict[str, Any] = {"type": rtype, "id": rid, "timestamp": "2026-01-01T00:00:00.000Z"}
    if lane is not None:
        out["lane"] = lane
    out.update(extra)
    return out


def ids(items: list[dict[str, Any]]) -> list[str]:
    """The ``id`` of each dict, in order."""
    return [str(i["id"]) for i in items]


def snapshot(s: SessionStore) -> dict[str, Any]:
    """Everything a session exposes, for before/after comparisons."""
    return {
        "entries": s.iter_entries(),
        "records": s.records(),
        "lanes": {k: vars(v) for k, v in s.lanes().items()},
        "last_seq": s.last_seq(),
        "count": s.entry_count(),
    }


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
