"""The session header, declared once: line 1 of a JSONL session file, the ``header`` of a
database session (``design/storage.md``); ``format`` tells our files from pi's (a pi header
has none), and unknown keys are kept (a newer writer's)."""

from __future__ import annotations

from typing import Any

VERSION = 3
"""pi's session format version, the one our entries follow (pi files are migrated to it)."""

FORMAT = "durable-harness/1"
"""The ``format`` value of our headers."""


def new_header(
    sid: str,
    timestamp: str,
    cwd: str,
    parent_session: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The header of a new session ``sid`` created at ``timestamp`` in ``cwd``, with
    ``parentSession`` when forked, then ``extra`` (which may override any key)."""
    header: dict[str, Any] = {
        "type": "session",
        "version": VERSION,
        "format": FORMAT,
        "id": sid,
        "timestamp": timestamp,
        "cwd": cwd,
    }
    if parent_session:
        header["parentSession"] = parent_session
    header.update(extra or {})
    return header


def is_own_format(header: dict[str, Any]) -> bool:
    """True when a parsed first line is a durable-harness header (not a pi file)."""
    return header.get("type") == "session" and header.get("format") == FORMAT
