"""The recovery planner: a pure function from what storage holds to a recovery plan.

:func:`take_snapshot` does the I/O (reads lanes, the open runs' records, damage and whether a
live process holds the lease); :func:`plan` is pure: no I/O, no clock. The plan says, per lane,
what state it is in and what resuming would do, before anything runs
(``design/recovery.md`` walks every crash point).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from durable_harness.harness.state import LaneLog, RunState, fold_lane, fold_run
from durable_harness.storage.base import LaneState, SessionStore
from durable_harness.tools.processes import group_alive

Policy = Literal["ask", "fail-in-doubt", "retry-safe"]


@dataclass(frozen=True)
class ToolDeclaration:
    """What the planner needs to know of a tool today: its ``replay`` and whether it has a
    ``reconcile`` hook."""

    replay: str
    can_reconcile: bool = False


@dataclass
class LaneSnapshot:
    """One lane as stored: its state, the open run's records, and its whole log folded."""

    lane: LaneState
    run: RunState | None
    log: LaneLog
    run_records: list[dict[str, Any]]
    last_run: dict[str, Any] | None = None


@dataclass
class Snapshot:
    """What storage holds, read once. ``get_entry`` looks entries up by id."""

    session_id: str
    lanes: list[LaneSnapshot]
    damage: list[dict[str, Any]]
    lease: dict[str, Any] | None
    get_entry: Callable[[str], dict[str, Any] | None]


@dataclass
class ToolCallPlan:
    """Contract fields ``tool_call_id``, ``tool_name``, ``status``, ``replay`` plus ``action``:
    ``none``, ``execute``, ``re-execute``, ``reconcile``, ``await_decision``, ``fail``,
    ``apply_decision`` or ``abort``; ``declared_replay`` is the tool's declaration today;
    ``arguments`` are the call's arguments (what an operator checks before deciding)."""

    tool_call_id: str
    tool_name: str
    status: str
    replay: str | None
    action: str
    attempts: int = 0
    declared_replay: str | None = None
    decision: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    process: dict[str, Any] | None = None


@dataclass
class LanePlan:
    """Contract fields ``lane``, ``state``, ``run_id``, ``abort_requested``, ``next_action``,
    ``tool_calls``; plus ``reason``, the provider attempts per turn and their cap, the last safe
    boundary, the cost known lost (attempts whose usage is unknown, never counted as zero),
    queued items and deferred writes."""

    lane: str
    state: str
    run_id: str | None
    abort_requested: bool
    next_action: str
    tool_calls: list[ToolCallPlan] = field(default_factory=list)
    reason: str | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    attempt_cap: int = 5
    last_safe_boundary: dict[str, Any] | None = None
    cost_unknown_attempts: int = 0
    queued: list[dict[str, Any]] = field(default_factory=list)
    deferred_writes: list[str] = field(default_factory=list)
    last_run: dict[str, Any] | None = None


@dataclass
class RecoveryPlan:
    """The plan: ``session_id``, ``lanes``, ``damage`` (contract), plus ``lease`` (the live
    holder, if any) and ``corruption`` (states a single writer cannot produce)."""

    session_id: str
    lanes: list[LanePlan]
    damage: list[dict[str, Any]]
    lease: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form printed by ``durable-harness recover --json``."""
        return asdict(self)

    def lane(self, name: str) -> LanePlan:
        """Return one lane's plan (KeyError if absent)."""
        for lp in self.lanes:
            if lp.lane == name:
                return lp
        raise KeyError(name)


def take_snapshot(store: SessionStore) -> Snapshot:
    """Read what recovery needs from ``store`` (lanes, open runs, lane logs, damage, lease)."""
    lanes = []
    for state in store.lanes().values():
        records = store.records(state.name)
        run = None
        run_records: list[dict[str, Any]] = []
        if state.run_id is not None and state.run_seq is not None:
            run_records = [
                r for r in records if r["seq"] >= state.run_seq and r.get("runId") == state.run_id
            ]
            run = fold_run(state.run_id, state.name, run_records, store.get_entry)
            for call in run.tool_calls:
                if call.process and isinstance(call.process.get("pgid"), int):
                    start = call.process.get("startTime")
                    alive = group_alive(
                        call.process["pgid"], start if isinstance(start, int) else None
                    )
                    call.process = {**call.process, "alive": alive}
        lanes.append(LaneSnapshot(state, run, fold_lane(records), run_records, _last_run(records)))
    lease = store.lease_holder()
    if lease is not None and lease.get("self"):
        lease = None
    return Snapshot(store.session_id, lanes, list(store.damage), lease, store.get_entry)


def _last_run(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The lane's latest settled run: ``{run_id, outcome, reason, attempts}`` (attempts per turn),
    so a run parked at the attempt cap still shows its count."""
    finished = [r for r in records if r.get("type") == "run_finished"]
    if not finished:
        return None
    last = finished[-1]
    attempts: dict[str, int] = {}
    for r in records:
        if r.get("type") == "provider_request_started" and r.get("runId") == last.get("runId"):
            key = str(r.get("turn"))
            attempts[key] = attempts.get(key, 0) + 1
    return {
        "run_id": last.get("runId"),
        "outcome": last.get("outcome"),
        "reason": last.get("reason"),
        "attempts": attempts,
    }


def _corruption(
    ls: LaneSnapshot, get_entry: Callable[[str], dict[str, Any] | None]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    started: set[str] = set()
    open_runs = 0
    lane = ls.lane.name
    for rec in ls.run_records:
        rtype = rec.get("type")
        if rtype == "run_started":
            open_runs += 1
        elif rtype == "tool_started":
            started.add(str(rec.get("toolCallId")))
            rid = rec.get("resultEntryId")
            entry = get_entry(str(rid)) if rid else None
            msg = (entry or {}).get("message") or {}
            if entry is not None and msg.get("toolCallId") != rec.get("toolCallId"):
                out.append(
                    {
                        "kind": "id_conflict",
                        "line": None,
                        "seq": rec["seq"],
                        "detail": f"provisioned result id {rid} holds other content",
                        "lane": lane,
                    }
                )
        elif (
            rtype == "tool_finished"
            and rec.get("outcome") == "ok"
            and str(rec.get("toolCallId")) not in started
        ):
            out.append(
                {
                    "kind": "settlement_without_intent",
                    "line": None,
                    "seq": rec["seq"],
                    "lane": lane,
                    "detail": f"tool_finished for {rec.get('toolCallId')} has no tool_started",
                }
            )
    if open_runs > 1:
        out.append(
            {
                "kind": "two_open_runs",
                "line": None,
                "seq": ls.run_records[0]["seq"],
                "lane": lane,
                "detail": f"lane {lane} has {open_runs} run_started records open",
            }
        )
    return out


def plan(
    snapshot: Snapshot,
    tools: dict[str, ToolDeclaration],
    *,
    policy: Policy = "ask",
    decisions: dict[str, dict[str, Any]] | None = None,
    attempt_cap: int = 5,
    reconciled: dict[str, bool] | None = None,
) -> RecoveryPlan:
    """Compute the recovery plan (pure).

    Args:
        snapshot: from :func:`take_snapshot`.
        tools: today's tool declarations by name.
        policy: ``ask`` (wait for decisions), ``retry-safe`` (never wait: fail what cannot be
            re-run or reconciled), ``fail-in-doubt`` (fail every in-doubt call).
        decisions: ``{tool_call_id: {"decision": "retry"|"fail"|"result", "result": text}}``
            about to be given (already-recorded decisions come from the log).
        attempt_cap: provider attempts per turn.
        reconciled: ``{tool_call_id: could the reconcile hook tell?}`` from
            :func:`probe_reconcile`; a call whose hook could not tell needs a decision.
    """
    decisions = decisions or {}
    reconciled = reconciled or {}
    lanes: list[LanePlan] = []
    damage = list(snapshot.damage)
    # With damage in the file, "no intent found" no longer proves "never started": the intent
    # may be in a line that was lost or left out.
    damaged = any(d.get("kind") != "torn_tail" for d in damage)
    for ls in sorted(snapshot.lanes, key=lambda x: x.lane.name):
        damage.extend(_corruption(ls, snapshot.get_entry))
        queued = [{"queue": q.queue, "itemId": q.item_id} for q in ls.log.queue]
        deferred = [str(d["id"]) for d in ls.log.deferred]
        run = ls.run
        if run is None:
            nxt = "start_next_run" if ls.log.pending("next_run") else "none"
            lanes.append(
                LanePlan(
                    ls.lane.name,
                    "idle",
                    None,
                    False,
                    nxt,
                    queued=queued,
                    deferred_writes=deferred,
                    attempt_cap=attempt_cap,
                    last_run=ls.last_run,
                )
            )
            continue
        lp = LanePlan(
            ls.lane.name,
            "suspended",
            run.run_id,
            run.abort_requested,
            "",
            reason="crash",
            attempts={str(k): v for k, v in run.attempts.items()},
            attempt_cap=attempt_cap,
            queued=queued,
            deferred_writes=deferred,
            cost_unknown_attempts=run.cost_unknown_attempts + (1 if run.pending is not None else 0),
        )
        boundary = _boundary(run, ls.run_records)
        lp.last_safe_boundary = boundary
        if snapshot.lease is not None:
            lp.state, lp.reason, lp.next_action = "running", None, "none_held_by_live_process"
        for call in run.tool_calls:
            lp.tool_calls.append(
                _call_plan(
                    call,
                    tools,
                    policy,
                    decisions,
                    run.abort_requested,
                    reconciled.get(call.tool_call_id),
                    damaged,
                )
            )
        if snapshot.lease is not None:
            lanes.append(lp)
            continue
        waiting = [c for c in lp.tool_calls if c.action == "await_decision"]
        open_calls = [c for c in lp.tool_calls if c.status != "completed"]
        if run.abort_requested:
            lp.next_action = "settle_aborted"
        elif run.pending is not None:
            used = run.attempts.get(run.pending.turn, 0)
            lp.next_action = (
                "park_failed_attempt_cap" if used >= attempt_cap else "reissue_provider_request"
            )
        elif open_calls:
            if waiting:
                lp.reason, lp.next_action = "awaiting_decision", "await_decision"
            else:
                lp.next_action = "resume_tool_calls"
        elif run.last_assistant_id and not run.save_point_after:
            if run.tool_calls:
                lp.next_action = "save_point"
            elif ls.log.pending("steer") or ls.log.pending("follow_up"):
                lp.next_action = "deliver_queued"
            else:
                lp.next_action = "finish_run"
        else:
            used = run.attempts.get(run.turns + 1, 0)
            lp.next_action = (
                "park_failed_attempt_cap" if used >= attempt_cap else "issue_provider_request"
            )
        lanes.append(lp)
    return RecoveryPlan(snapshot.session_id, lanes, damage, snapshot.lease)


def _boundary(run: RunState, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    safe = ("run_started", "save_point", "provider_request_finished", "tool_finished")
    for rec in reversed(records):
        if rec.get("type") in safe:
            return {"seq": rec["seq"], "type": rec["type"]}
    return None


def _call_plan(
    call: Any,
    tools: dict[str, ToolDeclaration],
    policy: Policy,
    decisions: dict[str, dict[str, Any]],
    aborting: bool,
    reconciled: bool | None,
    damaged: bool = False,
) -> ToolCallPlan:
    decl = tools.get(call.tool_name)
    declared = decl.replay if decl else None
    replay = call.replay if call.status != "not_started" else declared
    cp = ToolCallPlan(
        call.tool_call_id,
        call.tool_name,
        call.status,
        replay,
        "none",
        call.attempts,
        declared,
        arguments=dict(call.arguments),
        process=call.process,
    )
    decision = decisions.get(call.tool_call_id) or call.decision
    if call.status == "completed":
        return cp
    if aborting:
        cp.action = "abort"
        return cp
    if call.status == "not_started" and (not damaged or declared == "safe"):
        cp.action = "execute"
        return cp
    # in doubt, or not started as far as a damaged log can tell (treated the same way)
    if decision is not None:
        cp.decision = decision
        cp.action = "re-execute" if decision.get("decision") == "retry" else "apply_decision"
    elif policy == "fail-in-doubt":
        cp.action = "fail"
    elif call.replay == "safe" and declared == "safe":
        cp.action = "re-execute"
    elif decl is not None and decl.can_reconcile and reconciled is not False:
        cp.action = "reconcile"
    elif policy == "retry-safe":
        cp.action = "fail"
    else:
        cp.action = "await_decision"
    return cp
