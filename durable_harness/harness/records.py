"""Operation-log record constructors: the vocabulary of the design brief, section 2.

Every record is a dict with ``type``, ``id``, ``lane``, ``runId`` (where it applies) and
``timestamp``; storage adds ``seq``. These helpers only build dicts: they never write.
"""

from __future__ import annotations

from typing import Any

from durable_harness.ids import new_id, now_iso

RECORD_TYPES = (
    "run_started",
    "provider_request_started",
    "provider_request_finished",
    "provider_request_failed",
    "tool_started",
    "tool_finished",
    "tool_process",
    "queue_enqueued",
    "queue_consumed",
    "queue_cancelled",
    "write_deferred",
    "save_point",
    "abort_requested",
    "decision",
    "run_finished",
)

QUEUES = ("steer", "follow_up", "next_run")


def record(rtype: str, lane: str, run_id: str | None, **fields: Any) -> dict[str, Any]:
    """Build a record of type ``rtype`` (one of :data:`RECORD_TYPES`) with a fresh ``id``."""
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
