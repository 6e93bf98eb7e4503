"""Operation-log record constructors: the vocabulary declared in
:mod:`durable_harness.models.records` (design brief, section 2).

Every record is a dict with ``type``, ``id``, ``lane``, ``runId`` (where it applies) and
``timestamp``; storage adds ``seq``. These helpers only build dicts: they never write.

Importing this module registers the declarations' field check with storage
(:func:`durable_harness.storage.shapes.register_record_check`): a commit holding a record
whose fields do not match its declaration is refused with ``InvalidOp`` (nothing written), and
a stored record of the wrong shape reads back as damage. ``durable_harness/__init__.py``
imports it, so the check is in place before any store is opened.
"""

from __future__ import annotations

from typing import Any, get_args

from durable_harness.ids import new_id, now_iso
from durable_harness.models.records import (
    DECLARATIONS,
    RECORD_TYPES,
    Queue,
    record_fields_error,
)
from durable_harness.storage.shapes import register_record_check

register_record_check(record_fields_error)

QUEUES: tuple[str, ...] = get_args(Queue)
"""The input queues, in delivery order."""

__all__ = ["QUEUES", "RECORD_TYPES", "idempotency_key", "record"]


def record(rtype: str, lane: str, run_id: str | None, **fields: Any) -> dict[str, Any]:
    """Build a record of type ``rtype`` (one of :data:`RECORD_TYPES`, declared in
    :mod:`durable_harness.models.records`) with a fresh ``id``. The fields are checked against
    the declaration when the record is committed.

    Raises:
        ValueError: ``rtype`` is not a declared record type (a programming error).
    """
    if rtype not in DECLARATIONS:
        raise ValueError(f"undeclared record type {rtype!r}; declare it in models/records.py")
    rec: dict[str, Any] = {"type": rtype, "id": new_id(), "lane": lane, "timestamp": now_iso()}
    if run_id is not None:
        rec["runId"] = run_id
    rec.update(fields)
    return rec


def idempotency_key(run_id: str, call_key: str) -> str:
    """The idempotency key handed to a tool: ``"<run id>:<call key>"`` (the call key is
    ``"<assistant entry id>/<index>"``, :func:`~durable_harness.harness.state.call_key`):
    unique per call even when a provider repeats tool-call ids, and stable across restarts
    because both parts are durable before the tool starts."""
    return f"{run_id}:{call_key}"
