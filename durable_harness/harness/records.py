"""Operation-log record constructors: the vocabulary declared in
:mod:`durable_harness.models.records` (design brief, section 2).

Every record is a dict with ``type``, ``id``, ``lane``, ``runId`` (where it applies) and
``timestamp``; storage adds ``seq``. These helpers only build dicts: they never write.

Importing this module (``durable_harness/__init__.py`` does) registers the declarations' field
check with storage (:func:`durable_harness.storage.shapes.register_record_check`): a commit of
a record whose fields do not match is refused (``InvalidOp``), a stored one reads as damage. A
:class:`BuiltRecord` is trusted (not checked at commit): the harness builds it from values of
the declared types, checked where they entered, and :func:`record` makes its envelope itself
(a declared ``type``, a fresh ``id``, ``lane`` and ``runId`` that it checked are strings or
null); the checks would cost about 6% of a turn to find nothing. A record whose envelope
:func:`record` cannot vouch for (a ``lane`` that is no string, a field naming ``type``, ``id``
or ``runId``) is built as an unsure record instead, checked in full at commit, so it is refused
with the same error as before. ``DURABLE_HARNESS_CHECK_ALL_RECORDS=1``
(:data:`durable_harness.storage.shapes.CHECK_TRUSTED`) checks every record; the test suite
sets it (``design/api.md``).
"""

from __future__ import annotations

from typing import Any, Protocol, get_args

from durable_harness.ids import new_id, now_iso
from durable_harness.models.records import (
    DECLARATIONS,
    RECORD_TYPES,
    Queue,
    record_fields_error,
)
from durable_harness.storage.shapes import register_record_check


class BuiltRecord(dict[str, Any]):
    """A record built by :func:`record`: a plain ``dict`` in every other respect (it compares,
    serialises and copies as one; storage keeps a plain copy). Its exact type is the mark that
    lets storage skip the check (see the module docstring)."""

    __slots__ = ()


class _UnsureRecord(BuiltRecord):
    """A record :func:`record` built without vouching for its envelope: not of the trusted
    type, so storage checks it in full."""

    __slots__ = ()


register_record_check(record_fields_error, trusted=BuiltRecord)

_ENVELOPE_FIELDS = frozenset({"type", "id", "runId"})
"""Envelope keys a caller's fields could set (``lane`` is a parameter of :func:`record`)."""
_CALL_FIELDS = _ENVELOPE_FIELDS | {"toolCallId", "callKey"}

QUEUES: tuple[str, ...] = get_args(Queue)
"""The input queues, in delivery order."""

__all__ = [
    "QUEUES",
    "RECORD_TYPES",
    "BuiltRecord",
    "CallRef",
    "call_record",
    "idempotency_key",
    "record",
]


def record(rtype: str, lane: str, run_id: str | None, **fields: Any) -> BuiltRecord:
    """Build a record of type ``rtype`` (one of :data:`RECORD_TYPES`, declared in
    :mod:`durable_harness.models.records`) with a fresh ``id``. The caller passes values of the
    declared field types; the result is a :class:`BuiltRecord`, whose fields storage does not
    re-check at commit.

    Raises:
        ValueError: ``rtype`` is not a declared record type (a programming error).
    """
    if rtype not in DECLARATIONS:
        raise ValueError(f"undeclared record type {rtype!r}; declare it in models/records.py")
    sure = (
        isinstance(lane, str)
        and (run_id is None or isinstance(run_id, str))
        and (not fields or _ENVELOPE_FIELDS.isdisjoint(fields))
    )
    rec = (BuiltRecord if sure else _UnsureRecord)(
        type=rtype, id=new_id(), lane=lane, timestamp=now_iso()
    )
    if run_id is not None:
        rec["runId"] = run_id
    if fields:
        rec.update(fields)
    return rec


class CallRef(Protocol):
    """What names a tool call in a record: a folded
    :class:`~durable_harness.harness.state.ToolCallState` or a plan's
    :class:`~durable_harness.recovery.decide.ToolCallPlan`."""

    @property
    def tool_call_id(self) -> str:
        """The id the provider gave the call."""

    @property
    def key(self) -> str:
        """The call's identity in its run (``"<entry id>/<index>"``)."""


def call_record(rtype: str, lane: str, run_id: str, call: CallRef, **fields: Any) -> BuiltRecord:
    """:func:`record` of a record about one tool call: its ``toolCallId`` and ``callKey``,
    then ``fields``."""
    if fields and not _CALL_FIELDS.isdisjoint(fields):  # through record's own rules
        return record(rtype, lane, run_id, toolCallId=call.tool_call_id, callKey=call.key, **fields)
    rec = record(rtype, lane, run_id)  # the same keys in the same order, without a second **
    rec["toolCallId"] = call.tool_call_id
    rec["callKey"] = call.key
    rec.update(fields)
    return rec


def idempotency_key(run_id: str, call_key: str) -> str:
    """The idempotency key handed to a tool: ``"<run id>:<call key>"`` (the call key is
    ``"<assistant entry id>/<index>"``, :func:`~durable_harness.harness.state.call_key`):
    unique per call even when a provider repeats tool-call ids, and stable across restarts
    because both parts are durable before the tool starts."""
    return f"{run_id}:{call_key}"
