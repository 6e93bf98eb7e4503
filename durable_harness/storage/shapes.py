"""Shape checks for stored entries and records: on read a value that fails is damage, left out; on
commit the same checks run first (:func:`op_shape_error`), so a commit never reads back as
damage. Storage knows the record envelope; record fields are the registered check's
(``design/api.md``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from durable_harness.errors import IdConflict, UnknownEntry
from durable_harness.storage.base import EntryOp, LaneOp, RecordOp

RecordCheck = Callable[[dict[str, Any]], str | None]
"""A record check: why the record is malformed, or ``None``."""

_record_checks: list[RecordCheck] = []
_trusted: set[type] = set()

CHECK_TRUSTED: bool = os.environ.get("DURABLE_HARNESS_CHECK_ALL_RECORDS") == "1"
"""Whether trusted records are checked too, envelope and registered checks
(``$DURABLE_HARNESS_CHECK_ALL_RECORDS=1``).
"""


def register_record_check(check: RecordCheck, *, trusted: type | None = None) -> None:
    """Add ``check`` (why a record is malformed, or ``None``; never raises) to what
    :func:`record_shape_error` applies after the envelope. A record of exactly the ``dict``
    subclass ``trusted`` is not checked (unless :data:`CHECK_TRUSTED`): its builder guarantees
    the envelope (``type`` and ``id`` strings, ``lane`` and ``runId`` strings or null) and the
    fields, and builds any record it cannot vouch for as another type."""
    if check not in _record_checks:
        _record_checks.append(check)
    if trusted is not None:
        _trusted.add(trusted)


def _opt(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, kind)


# The checks below are written flat (no helper call per field, ``rec.get`` bound once): they run
# on every op of every commit, about 7 a turn ("Turn cost, third pass" in design/run-loop.md).
# The order of the tests, and so which message a value with several faults gets, is the rule.


def record_shape_error(rec: dict[str, Any]) -> str | None:
    """Why ``rec`` is not a well-formed operation-log record, or ``None``: the envelope, then the
    registered checks (neither on a trusted record: :func:`register_record_check`)."""
    if type(rec) in _trusted and not CHECK_TRUSTED:
        return None
    get = rec.get
    if not isinstance(get("type"), str) or not isinstance(get("id"), str):
        return "type and id must be strings"
    lane = get("lane")
    run_id = get("runId")
    if (lane is not None and not isinstance(lane, str)) or (
        run_id is not None and not isinstance(run_id, str)
    ):
        return "lane and runId must be strings or null"
    for check in _record_checks:
        problem = check(rec)
        if problem is not None:
            return problem
    return None


_BAD_CALL = "a toolCall block needs string id and name and object arguments"


def _content_error(content: Any) -> str | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return "content must be a string or a list of blocks"
    bad_call = None  # a block that is no object is named first, wherever it is
    for b in content:
        if not isinstance(b, dict):
            return "content must be a string or a list of blocks"
        if bad_call is None and b.get("type") == "toolCall":
            args = b.get("arguments")
            if not (
                isinstance(b.get("id"), str)
                and isinstance(b.get("name"), str)
                and (args is None or isinstance(args, dict))
            ):
                bad_call = _BAD_CALL
    return bad_call


def entry_shape_error(entry: dict[str, Any]) -> str | None:
    """Why ``entry`` is not a well-formed tree entry, or ``None`` (unknown types only need
    ``type``, ``id`` and ``parentId``)."""
    get = entry.get
    etype = get("type")
    if not isinstance(etype, str) or not isinstance(get("id"), str):
        return "type and id must be strings"
    parent = get("parentId")
    if parent is not None and not isinstance(parent, str):
        return "parentId must be a string or null"
    if etype == "message":
        msg = get("message")
        if not isinstance(msg, dict):
            return "message must be an object with a string role"
        role = msg.get("role")
        if not isinstance(role, str):
            return "message must be an object with a string role"
        if "content" in msg or role in ("user", "assistant", "toolResult"):
            err = _content_error(msg.get("content"))
            if err:
                return err
        if role == "toolResult" and not isinstance(msg.get("toolCallId"), str):
            return "a toolResult needs a string toolCallId"
        usage = msg.get("usage")
        if usage is not None and not isinstance(usage, dict):
            return "usage must be an object"
    elif etype == "label" and not isinstance(get("targetId"), str):
        return "a label needs a string targetId"
    elif etype in ("compaction", "branch_summary") and not _opt(get("summary"), str):
        return "summary must be a string"
    elif etype == "compaction" and not _opt(get("firstKeptEntryId"), str):
        return "firstKeptEntryId must be a string or null"
    elif etype in ("model_change",) and not (
        _opt(get("provider"), str) and _opt(get("modelId"), str)
    ):
        return "provider and modelId must be strings"
    return None


def op_shape_error(op: Any) -> str | None:
    """Why a commit op would read back as damage, or ``None``."""
    if isinstance(op, RecordOp):
        if not isinstance(op.record, dict):
            return "a record must be an object"
        return record_shape_error(op.record)
    if isinstance(op, EntryOp):
        if not isinstance(op.entry, dict):
            return "an entry must be an object"
        if op.lane is not None and not isinstance(op.lane, str):
            return "lane must be a string or null"
        return entry_shape_error(op.entry)
    if isinstance(op, LaneOp):
        if not isinstance(op.lane, str):
            return "lane must be a string"
        if op.sets_leaf() and not _opt(op.leaf_id, str):
            return "leafId must be a string or null"
        if not _opt(op.config, dict):
            return "config must be an object"
        return None
    return f"not a commit op: {type(op).__name__}"


def checked_id(what: str, body: dict[str, Any]) -> str:
    """The id of an ``entry`` or ``record`` (``what``) body about to be committed.

    Raises:
        UnknownEntry: the id is not a non-empty string.
    """
    ident = body.get("id")
    if not isinstance(ident, str) or not ident:
        raise UnknownEntry(f"{'an' if what == 'entry' else 'a'} {what} needs a non-empty string id")
    return ident


def id_conflict(what: str, ident: str, where: str) -> IdConflict:
    """The error of an ``entry`` or ``record`` (``what``) whose id ``where`` already holds."""
    return IdConflict(f"{what} id {ident} already exists in {where}", **{f"{what}_id": ident})
