"""Read-side helpers of the host (``design/host.md``): the status object, the answer to a
duplicate send, pages of a transcript and of an operation log, and the rules for when a kept
recovery plan must be read again. Pure functions of what they are given."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from durable_harness.host.record import SessionRecord
from durable_harness.recovery.decide import RecoveryPlan
from durable_harness.session.session import Session
from durable_harness.storage.base import SessionStore
from durable_harness.tools.base import Tool


def copy_record(rec: SessionRecord) -> SessionRecord:
    """A record the caller may change without changing the kept one."""
    return dataclasses.replace(rec, allowed_tools=[*rec.allowed_tools])


def asks_hooks(plan: RecoveryPlan, tools: Mapping[str, Tool]) -> bool:
    """Whether planning asked a reconcile hook: some call is in doubt and its tool has one."""
    for call in plan.open_calls():
        tool = tools.get(call.tool_name)
        if tool is not None and tool.can_reconcile:
            return True
    return False


def sees_live_group(plan: RecoveryPlan) -> bool:
    """Whether the plan reports a live process group: like a reconcile hook's answer, that
    is an observation of the world (the group may end at any moment), so such a plan is read
    again rather than kept."""
    return any((c.process or {}).get("alive") for lane in plan.lanes for c in lane.tool_calls)


def acceptance(rec: dict[str, Any], lane: str, *, duplicate: bool) -> dict[str, Any]:
    """What ``send`` returns for an input accepted before (``rec``: its ``run_started`` or
    queue receipt): ``{"mode", "lane", "run_id" | "item_id", "duplicate"}``."""
    if rec.get("type") == "run_started":
        out = {"mode": "prompt", "lane": lane, "run_id": rec.get("runId")}
    else:
        out = {"mode": rec.get("queue", "write"), "lane": lane, "item_id": rec.get("itemId")}
    out["duplicate"] = duplicate
    return out


def status_view(
    rec: SessionRecord,
    store: SessionStore,
    running: set[str],
    plan: RecoveryPlan | None,
    port: int | None,
) -> dict[str, Any]:
    """``status``'s answer (see :meth:`~durable_harness.host.manager.SessionManager.status`):
    the record's facts, each lane of ``store`` (``live`` when in ``running``), the plan."""
    lanes = [
        {"lane": name, "leaf": lane.leaf_id, "run_id": lane.run_id, "live": name in running}
        for name, lane in sorted(store.lanes().items())
    ]
    return {
        "id": rec.id,
        "state": rec.state,
        "generation": rec.generation,
        "lanes": lanes,
        "plan": plan.to_json() if plan is not None else None,
        "port": port,
        "last_error": rec.last_error,
    }


def transcript_page(store: SessionStore, lane: str, offset: int, limit: int) -> dict[str, Any]:
    """A page of the lane's transcript (the entries from the root to its leaf):
    ``{"lane", "total", "offset", "limit", "entries"}``."""
    session = Session(store)
    path = session.path(session.leaf(lane))
    return {
        "lane": lane,
        "total": len(path),
        "offset": offset,
        "limit": limit,
        "entries": path[offset : offset + limit],
    }


def log_page(store: SessionStore, lane: str | None, since_seq: int, limit: int) -> dict[str, Any]:
    """A page of the operation log: ``{"records", "next_since_seq"}`` (records with a ``seq``
    above ``since_seq``; ``next_since_seq`` is ``None`` on the last page)."""
    records = store.records(lane, since_seq=since_seq)
    page = records[:limit]
    more = len(records) > limit
    return {"records": page, "next_since_seq": page[-1]["seq"] if more and page else None}
