"""Operation-log record constructors: the vocabulary declared in
:mod:`durable_harness.models.records` (design brief, section 2).

Every record is a dict with ``type``, ``id``, ``lane``, ``runId`` (where it applies) and
``timestamp``; storage adds ``seq``. These helpers only build dicts: they never write.

Importing this module (``durable_harness/__init__.py`` does) registers the declarations' field
check with storage (:func:`durable_harness.storage.shapes.register_record_check`): a commit of
a record whose fields do not match is refused (``InvalidOp``), a stored one reads as damage. A
:class:`BuiltRecord` is trusted (only its envelope is checked): the harness builds it from
values of the declared types, checked where they entered, and the check would cost about 4% of
a turn to find nothing. ``DURABLE_HARNESS_CHECK_ALL_RECORDS=1``
(:data:`durable_harness.storage.shapes.CHECK_TRUSTED`) checks them too; the test suite sets it
(``design/api.md``).
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
    serialises and copies as one; storage keeps a plain copy). Its type is the mark that lets
    storage skip the field check (see the module docstring)."""

    __slots__ = ()


register_record_check(record_fields_error, trusted=BuiltRecord)

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
    rec = BuiltRecord(type=rtype, id=new_id(), lane=lane, timestamp=now_iso())
    if run_id is not None:
        rec["runId"] = run_id
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
    return record(rtype, lane, run_id, toolCallId=call.tool_call_id, callKey=call.key, **fields)


def idempotency_key(run_id: str, call_key: str) -> str:
    """The idempotency key handed to a tool: ``"<run id>:<call key>"`` (the call key is
    ``"<assistant entry id>/<index>"``, :func:`~durable_harness.harness.state.call_key`):
    unique per call even when a provider repeats tool-call ids, and stable across restarts
    because both parts are durable before the tool starts."""
    return f"{run_id}:{call_key}"
