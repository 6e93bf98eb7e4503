"""Read-only reports over a session: the operation-log timeline and cost per turn and run."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from durable_harness.storage.base import SessionStore


def timeline(store: SessionStore, lane: str | None = None) -> list[dict[str, Any]]:
    """Return the operation log (optionally one lane) as rows ``{seq, timestamp, lane, runId,
    type, summary}`` in seq order; a host's ``session_lifecycle`` row also has ``state`` and
    ``generation`` (the writer lease's generation that entered it, ``design/host.md``)."""
    rows = []
    for rec in store.records(lane):
        row = {
            "seq": rec["seq"],
            "timestamp": rec.get("timestamp"),
            "lane": rec.get("lane"),
            "runId": rec.get("runId"),
            "type": rec["type"],
            "summary": summarize_record(rec),
        }
        if rec["type"] == "session_lifecycle":
            row |= {"state": rec.get("state"), "generation": rec.get("generation")}
        rows.append(row)
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


_SUMMARIES = {
    "run_started": "prompt entry {promptEntryId} via {provider}",
    "provider_request_started": "turn {turn} attempt {attempt} -> {responseEntryId}",
    "tool_started": "{toolName} {toolCallId} replay={replay}",
    "tool_finished": "{toolCallId} {outcome}",
    "decision": "{toolCallId} {decision}",
    "save_point": "after turn {turn}",
    "tool_process": "{toolCallId} process group {pgid}",
    "tool_process_killed": "{toolCallId} process group {pgid} killed ({by})",
}
"""Record types whose summary is their fields in a line (each shown by :func:`_text`)."""


def summarize_record(rec: dict[str, Any]) -> str:
    """One line describing a record for humans (no Python reprs: see ``design/cli.md``)."""
    f = _Missing({key: _text(value) for key, value in rec.items()})
    t = rec.get("type")
    if t in _SUMMARIES:
        return _SUMMARIES[str(t)].format_map(f)
    if t == "provider_request_finished":
        usage = rec.get("usage") or {}
        return (
            f"turn {f['turn']} {f['stopReason']} tokens "
            f"{usage.get('totalTokens', 0)} cost {format_cost(message_cost(usage))}"
        )
    if t == "provider_request_failed":
        reason = f" [{rec['reason']}]" if rec.get("reason") else ""
        return f"turn {f['turn']} attempt {f['attempt']}{reason}: {f['error']}"
    if t in ("queue_enqueued", "queue_consumed", "queue_cancelled"):
        return f"{f['queue']} {_text(rec.get('itemId') or rec.get('itemIds'))}"
    if t == "write_deferred":
        return _text((rec.get("write") or {}).get("type"))
    if t == "run_finished":
        return f["outcome"] + (f" ({f['reason']})" if rec.get("reason") else "")
    if t == "session_lifecycle":  # a host's lifecycle state and the generation that wrote it
        error = f": {f['error']}" if rec.get("error") else ""
        return f"{f['state']}, generation {f['generation']}{error}"
    return ""


class _Missing(dict[str, str]):
    """The fields of a record for :data:`_SUMMARIES`: an absent one shows as ``-``."""

    def __missing__(self, key: str) -> str:
        return "-"


def message_cost(usage: Mapping[str, Any] | None) -> float | None:
    """The cost in USD of one provider answer from its pi ``usage``: ``cost.total``, or
    ``None`` when unknown (no usage, a ``null`` cost: no price was known)."""
    cost = (usage or {}).get("cost")
    total = cost.get("total") if isinstance(cost, Mapping) else None
    if isinstance(total, bool) or not isinstance(total, int | float):
        return None
    return float(total)


def _sum(parts: Iterable[float | None]) -> dict[str, Any]:
    """``{"cost", "known_cost", "unknown_cost_turns"}`` of some parts: a sum with an unknown
    part is unknown (``cost`` ``None``), its known part still told (``known_cost``)."""
    values = list(parts)
    known = sum(v for v in values if v is not None)
    unknown = sum(v is None for v in values)
    return {"cost": None if unknown else known, "known_cost": known, "unknown_cost_turns": unknown}


def cost_summary(
    records: Iterable[Mapping[str, Any]],
    entries: Callable[[], Iterable[Mapping[str, Any]]] = lambda: (),
) -> dict[str, Any]:
    """Cost per turn, per run and for the session (USD; tokens), from a session's records
    (every lane, seq order) and, for a session without settlements (a pi import), its entries
    (called only then). The one cost computation: ``durable-harness cost``, the console and
    :func:`cost_report` all read it (``design/run-loop.md``, "Cost").

    Returns ``{"turns": [{run_id, turn, purpose, tokens, cost}], "runs": [{run_id, turns,
    tokens, cost, known_cost, unknown_cost_turns}], "total": {tokens, cost, known_cost,
    unknown_cost_turns}, "unknown_cost_attempts"}``. A turn's ``cost`` is ``None`` when its
    price was unknown; a sum with such a turn is ``None`` too, ``known_cost`` keeping what is
    known. ``unknown_cost_attempts`` counts provider attempts that started and never settled
    (lost in a crash) or were cut off by an abort (``costUnknown``): never counted as zero,
    and not part of the sums (no answer was stored for them).
    """
    open_attempts: dict[tuple[str, Any, Any], bool] = {}
    turns: list[dict[str, Any]] = []
    for rec in records:
        rid = str(rec.get("runId") or "")
        t = rec.get("type")
        if t == "provider_request_started":
            open_attempts[(rid, rec.get("turn"), rec.get("attempt"))] = True
        elif t == "provider_request_finished" or (
            t == "provider_request_failed" and not rec.get("costUnknown")
        ):
            open_attempts.pop((rid, rec.get("turn"), rec.get("attempt")), None)
        if t == "provider_request_finished":
            turns.append(_turn(rid, rec.get("turn"), rec.get("purpose", "turn"), rec))
    if not turns:
        for e in entries():
            msg = e.get("message") or {}
            if e.get("type") == "message" and msg.get("role") == "assistant":
                turns.append(_turn(None, len(turns) + 1, "turn", msg))
    by_run: dict[str, list[dict[str, Any]]] = {}
    for t in turns:
        if t["run_id"] is not None:
            by_run.setdefault(t["run_id"], []).append(t)
    runs = [
        {
            "run_id": rid,
            "turns": len(ts),
            "tokens": sum(t["tokens"] for t in ts),
            **_sum(t["cost"] for t in ts),
        }
        for rid, ts in by_run.items()
    ]
    total = {"tokens": sum(t["tokens"] for t in turns), **_sum(t["cost"] for t in turns)}
    return {
        "turns": turns,
        "runs": runs,
        "total": total,
        "unknown_cost_attempts": len(open_attempts),
    }


def _turn(
    run_id: str | None, turn: Any, purpose: Any, has_usage: Mapping[str, Any]
) -> dict[str, Any]:
    usage = has_usage.get("usage") or {}
    tokens = int(usage.get("totalTokens", 0) or 0)
    return {
        "run_id": run_id,
        "turn": turn,
        "purpose": purpose,
        "tokens": tokens,
        "cost": message_cost(usage),
    }


def cost_report(store: SessionStore) -> dict[str, Any]:
    """:func:`cost_summary` of an open session."""
    return cost_summary(store.records(), lambda: store.iter_entries(("message",)))


def format_cost(part: Mapping[str, Any] | float | None, digits: int = 6) -> str:
    """A cost for humans (one rule for the CLI and the console): ``$0.001200``; ``unknown``
    when nothing of it is known; ``≥ $0.001200 (2 unknown)`` for a sum with unknown turns.
    ``part``: a number, ``None`` (unknown), or a sum of :func:`cost_summary`."""
    if not isinstance(part, Mapping):
        return "unknown" if part is None else f"${part:.{digits}f}"
    if part.get("cost") is not None:
        return f"${part['cost']:.{digits}f}"
    known, unknown = part.get("known_cost") or 0.0, part.get("unknown_cost_turns") or 0
    if not known:
        return "unknown"
    return f"≥ ${known:.{digits}f} ({unknown} unknown)"
