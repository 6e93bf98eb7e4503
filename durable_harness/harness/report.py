"""Read-only reports over a session: the operation-log timeline and cost per turn and run."""

from __future__ import annotations

import json
from typing import Any

from durable_harness.storage.base import SessionStore


def timeline(store: SessionStore, lane: str | None = None) -> list[dict[str, Any]]:
    """Return the operation log (optionally one lane) as rows ``{seq, timestamp, lane, runId,
    type, summary}`` in seq order."""
    rows = []
    for rec in store.records(lane):
        rows.append(
            {
                "seq": rec["seq"],
                "timestamp": rec.get("timestamp"),
                "lane": rec.get("lane"),
                "runId": rec.get("runId"),
                "type": rec["type"],
                "summary": summarize_record(rec),
            }
        )
    return rows


def _text(value: Any) -> str:
    """A record field for humans: ``-`` when absent, a list joined by commas, an object as
    JSON; never a Python repr."""
    items = list(value) if isinstance(value, list | tuple) else [value]
    shown = [
        json.dumps(v, ensure_ascii=False, default=str)
        if isinstance(v, dict | list | tuple)
        else str(v)
        for v in items
        if v is not None and v != ""
    ]
    return ", ".join(shown) or "-"


def summarize_record(rec: dict[str, Any]) -> str:
    """One line describing a record for humans (no Python reprs: see ``design/cli.md``)."""
    return _summary(rec)


def _summary(rec: dict[str, Any]) -> str:
    def f(key: str) -> str:
        return _text(rec.get(key))

    t = rec.get("type")
    if t == "run_started":
        return f"prompt entry {f('promptEntryId')} via {f('provider')}"
    if t == "provider_request_started":
        return f"turn {f('turn')} attempt {f('attempt')} -> {f('responseEntryId')}"
    if t == "provider_request_finished":
        usage = rec.get("usage") or {}
        return (
            f"turn {f('turn')} {f('stopReason')} tokens "
            f"{usage.get('totalTokens', 0)} cost ${(usage.get('cost') or {}).get('total', 0):.6f}"
        )
    if t == "provider_request_failed":
        return f"turn {f('turn')} attempt {f('attempt')}: {f('error')}"
    if t == "tool_started":
        return f"{f('toolName')} {f('toolCallId')} replay={f('replay')}"
    if t == "tool_finished":
        return f"{f('toolCallId')} {f('outcome')}"
    if t in ("queue_enqueued", "queue_consumed", "queue_cancelled"):
        return f"{f('queue')} {_text(rec.get('itemId') or rec.get('itemIds'))}"
    if t == "write_deferred":
        return _text((rec.get("write") or {}).get("type"))
    if t == "decision":
        return f"{f('toolCallId')} {f('decision')}"
    if t == "run_finished":
        reason = f" ({f('reason')})" if rec.get("reason") else ""
        return f"{f('outcome')}{reason}"
    if t == "save_point":
        return f"after turn {f('turn')}"
    if t == "tool_process":
        return f"{f('toolCallId')} process group {f('pgid')}"
    if t == "tool_process_killed":
        return f"{f('toolCallId')} process group {f('pgid')} killed ({f('by')})"
    return ""


def cost_report(store: SessionStore) -> dict[str, Any]:
    """Return cost per turn, per run and for the session (USD; tokens).

    ``unknown_cost_attempts`` counts provider attempts that started and never settled (lost in
    a crash) or were cut off by an abort (``costUnknown``): their cost is unknown, never counted
    as zero. Sessions without an operation log
    (pi imports) are costed from their assistant entries.
    """
    runs: dict[str, dict[str, Any]] = {}
    open_attempts: dict[tuple[str, Any, Any], bool] = {}
    turns = []
    for rec in store.records():
        rid = str(rec.get("runId") or "")
        t = rec.get("type")
        if t == "provider_request_started":
            open_attempts[(rid, rec.get("turn"), rec.get("attempt"))] = True
        elif t == "provider_request_finished" or (
            t == "provider_request_failed" and not rec.get("costUnknown")
        ):
            open_attempts.pop((rid, rec.get("turn"), rec.get("attempt")), None)
        if t == "provider_request_finished":
            usage = rec.get("usage") or {}
            cost = float((usage.get("cost") or {}).get("total", 0.0))
            run = runs.setdefault(rid, {"run_id": rid, "turns": 0, "tokens": 0, "cost": 0.0})
            run["turns"] += 1
            run["tokens"] += int(usage.get("totalTokens", 0))
            run["cost"] += cost
            turns.append(
                {
                    "run_id": rid,
                    "turn": rec.get("turn"),
                    "purpose": rec.get("purpose", "turn"),
                    "tokens": int(usage.get("totalTokens", 0)),
                    "cost": cost,
                }
            )
    if not turns:
        for e in store.iter_entries(("message",)):
            msg = e.get("message") or {}
            if msg.get("role") == "assistant":
                usage = msg.get("usage") or {}
                turns.append(
                    {
                        "run_id": None,
                        "turn": len(turns) + 1,
                        "purpose": "turn",
                        "tokens": int(usage.get("totalTokens", 0) or 0),
                        "cost": float((usage.get("cost") or {}).get("total", 0.0) or 0),
                    }
                )
    return {
        "turns": turns,
        "runs": list(runs.values()),
        "total": {"tokens": sum(t["tokens"] for t in turns), "cost": sum(t["cost"] for t in turns)},
        "unknown_cost_attempts": len(open_attempts),
    }
