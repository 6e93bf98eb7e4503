"""The run loop's next step, as a pure function of a run's folded state.

The live driver asks :func:`next_step` what to do after every commit; recovery asks the same
function about a run a crash left open, and the driver then executes exactly the step recovery
planned (``design/recovery.md``). One function, so what ``recover`` prints is what ``resume``
does. The per-call rules for calls in doubt live in :mod:`durable_harness.recovery.decide`;
here a call is only ``execute`` (not started) or whatever the caller planned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from durable_harness.harness.state import LaneLog, RunState, attempt_key
from durable_harness.models.records import RunLimit

#: What a lane does next. ``none``/``start_next_run`` are for an idle lane;
#: ``none_held_by_live_process`` for a lane whose session a live process holds.
LaneAction = Literal[
    "none",
    "start_next_run",
    "none_held_by_live_process",
    "settle_aborted",
    "park_failed_attempt_cap",
    "reissue_provider_request",
    "issue_provider_request",
    "resume_tool_calls",
    "await_decision",
    "save_point",
    "deliver_queued",
    "finish_run",
    "fail_run_limit",
]

#: What happens to one tool call of the open turn. ``reject``: a call not started whose tool is
#: not registered is answered with an error result, nothing runs.
CallAction = Literal[
    "none",
    "execute",
    "reject",
    "re-execute",
    "reconcile",
    "await_decision",
    "fail",
    "apply_decision",
    "abort",
]

#: Call actions that run the tool (a new ``tool_started`` intent).
RUNS_TOOL: frozenset[str] = frozenset({"execute", "re-execute"})


@dataclass(slots=True)
class Step:
    """One step of a run.

    Attributes:
        action: the lane action.
        calls: the action for each open tool call of the turn, by call key (only for
            ``resume_tool_calls`` / ``await_decision``).
        reason: why a run is parked or failed (``park_failed_attempt_cap``,
            ``fail_run_limit``), as written in ``run_finished.reason``.
        purpose: for a provider request step, what the request is for (``turn``,
            ``compaction``, ``branch_summary``).
        limit: the run limit a failing step enforces, as written in ``run_finished.limit``.
    """

    action: LaneAction
    calls: Mapping[str, CallAction] = field(default_factory=dict)
    reason: str | None = None
    purpose: str = "turn"
    limit: RunLimit | None = None


def next_step(run: RunState, log: LaneLog, calls: Mapping[str, CallAction]) -> Step:
    """The next step of ``run`` (pure: no I/O, no clock).

    Args:
        run: the run's folded state (:func:`durable_harness.harness.state.fold_run`).
        log: the lane's folded log (queues, deferred writes).
        calls: the action decided for each open tool call, by key; a missing key means
            ``execute`` (the live loop's calls, which this process issued itself).

    Order: an abort settles the run; an attempt in flight is re-issued (or parked at the cap);
    a turn with open calls runs them (a turn asking for more tool calls than the run's
    ``max_tool_calls`` fails the run before any starts); a settled turn gets its save point, or
    delivers queued messages, or finishes the run; otherwise the next provider request (the
    run fails at ``max_turns``, parks at the attempt cap).
    """
    limits = run.limits
    cap = limits.attempt_cap
    if run.abort_requested:
        return Step("settle_aborted")
    if run.pending is not None:
        used = run.attempts.get(run.pending.key, 0)
        purpose = run.pending.purpose
        if used >= cap:
            reason = _cap_reason(run, run.pending.key, used)
            return Step(
                "park_failed_attempt_cap", reason=reason, purpose=purpose, limit="attempt_cap"
            )
        return Step("reissue_provider_request", purpose=purpose)
    open_calls = [c for c in run.tool_calls if c.status != "completed"] if run.tool_calls else []
    if open_calls and run.last_assistant_id:
        if run.tool_calls_total > limits.max_tool_calls and all(
            c.status == "not_started" for c in run.tool_calls
        ):
            return Step(
                "fail_run_limit",
                reason=f"max_tool_calls {limits.max_tool_calls} reached "
                f"(turn {run.turns} asked for {len(run.tool_calls)}, "
                f"{run.tool_calls_total} in the run)",
                limit="max_tool_calls",
            )
        if not calls:  # the live loop: every open call is one this process issued
            return Step("resume_tool_calls")
        actions = {c.key: calls.get(c.key, "execute") for c in open_calls}
        waiting = "await_decision" in actions.values()
        return Step("await_decision" if waiting else "resume_tool_calls", actions)
    if run.last_assistant_id and not run.save_point_after:
        if run.tool_calls:
            return Step("save_point")
        if log.pending("steer") or log.pending("follow_up"):
            return Step("deliver_queued")
        return Step("finish_run")
    if run.turns >= limits.max_turns:
        return Step(
            "fail_run_limit", reason=f"max_turns {limits.max_turns} reached", limit="max_turns"
        )
    key = attempt_key("turn", run.turns + 1)
    used = run.attempts.get(key, 0)
    if used >= cap:
        return Step(
            "park_failed_attempt_cap", reason=_cap_reason(run, key, used), limit="attempt_cap"
        )
    return Step("issue_provider_request")


def _cap_reason(run: RunState, key: str, used: int) -> str:
    return (
        f"{key} of run {run.run_id} used {used} of {run.limits.attempt_cap} provider attempts "
        "(attempt cap reached)"
    )
