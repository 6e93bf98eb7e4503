"""Check that a resume did what its plan said, from the records it wrote.

``recover`` prints a plan; ``resume`` must take exactly the planned step and nothing else
(``design/recovery.md``). :func:`plan_followed` reads the records written after the plan was
made and names every place where what happened differs from what was planned. It reads only
the log (never the harness), so it is an independent witness: the crash matrix runs it on every
cell, and the property tests on generated and damaged logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durable_harness.recovery.decide import LanePlan, RecoveryPlan, ToolCallPlan

#: Records that belong to one tool call rather than to the lane.
_CALL_RECORDS = ("tool_started", "tool_finished", "tool_process", "tool_process_killed", "decision")
#: Records that accept input or come from outside the run loop: never a step of the plan.
_NOT_STEPS = ("queue_enqueued", "write_deferred", "abort_requested")

#: What each call action leaves as the call's first record after the plan (``None``: nothing).
_CALL_EVIDENCE: Mapping[str, tuple[str | None, ...]] = {
    # an execution can be refused before its intent (arguments that do not validate)
    "execute": ("tool_started", "tool_finished:error"),
    "reject": ("tool_finished:error",),
    "re-execute": ("tool_started",),
    "reconcile": ("tool_finished:reconciled",),
    "fail": ("tool_finished:failed_by_policy",),
    "apply_decision": ("tool_finished:decided_fail", "tool_finished:decided_result"),
    "abort": ("tool_finished:aborted",),
    "await_decision": (None,),
    "none": (None,),
}


#: Lane actions whose evidence is the type of the lane's first step record (``None``: none).
_FIRST_TYPE: Mapping[str, str | None] = {
    "none": None,
    "await_decision": None,
    "start_next_run": "run_started",
    "issue_provider_request": "provider_request_started",
    "save_point": "save_point",
    "deliver_queued": "save_point",
}


def _evidence(rec: dict[str, Any] | None) -> str | None:
    if rec is None:
        return None
    if rec.get("type") == "tool_finished":
        return f"tool_finished:{rec.get('outcome')}"
    return str(rec.get("type"))


def plan_followed(plan: RecoveryPlan, after: Iterable[dict[str, Any]]) -> list[str]:
    """Compare ``plan`` with ``after``, the records written once it was made (every lane, in
    seq order). Returns one line per difference; an empty list means the plan was followed.

    Only the planned run's records count for a lane with an open run (a run started after it
    settles, e.g. from the next-run queue, is the live loop's business). A call's evidence is
    its first record after the plan (``decision`` records excepted, and the kill of its
    process group when the plan said resume kills it first: :func:`_planned_kill`); a lane's
    is its first record that is neither about a call nor accepted input. Lanes held by a live
    process are not checked (nothing may be done to them).
    """
    recs = list(after)
    problems: list[str] = []
    for lp in plan.lanes:
        if lp.next_action == "none_held_by_live_process":
            continue
        mine = [
            r
            for r in recs
            if r.get("lane") == lp.lane and (lp.run_id is None or r.get("runId") == lp.run_id)
        ]
        problems += _lane_followed(lp, mine)
        limit_failed = lp.next_action == "fail_run_limit"
        for call in lp.tool_calls:
            if call.status == "completed":
                continue
            first = next(
                (
                    r
                    for r in mine
                    if r.get("type") in _CALL_RECORDS
                    and r.get("type") != "decision"
                    and not _planned_kill(call, r)
                    and (r.get("callKey") or r.get("toolCallId")) in (call.call_key,)
                ),
                None,
            )
            seen = _evidence(first)
            expected = ("tool_finished:not_run",) if limit_failed else _CALL_EVIDENCE[call.action]
            if seen not in expected:
                problems.append(
                    f"lane {lp.lane} call {call.tool_call_id} ({call.call_key}): planned "
                    f"{call.action}, log shows {seen or 'nothing'}"
                )
    return problems


def _planned_kill(call: ToolCallPlan, rec: dict[str, Any]) -> bool:
    """Whether ``rec`` is resume's kill of the process group the plan reported alive for
    ``call`` (:attr:`ToolCallPlan.kills_group`: "resume kills it first"): it precedes the
    action's own evidence. A kill the plan did not announce (no group, or one not alive) is
    not this, so it stays the call's evidence and is reported."""
    return (
        rec.get("type") == "tool_process_killed"
        and rec.get("by") == "resume"
        and call.kills_group
        and rec.get("pgid") == (call.process or {}).get("pgid")
    )


def _lane_followed(lp: LanePlan, recs: list[dict[str, Any]]) -> list[str]:
    steps = [r for r in recs if r.get("type") not in _CALL_RECORDS + _NOT_STEPS]
    first = next((r for r in steps if r.get("type") != "queue_consumed"), None)
    finished = next((r for r in steps if r.get("type") == "run_finished"), None)
    action = lp.next_action
    ok: bool
    if action in _FIRST_TYPE:
        want = _FIRST_TYPE[action]
        ok = first is None if want is None else first is not None and first.get("type") == want
    elif action == "reissue_provider_request":
        used = lp.attempts.get(lp.request_key or "", 0)
        ok = (
            first is not None
            and first.get("type") == "provider_request_started"
            and first.get("purpose", "turn") == lp.purpose
            and first.get("attempt") == used + 1
        )
    elif action == "resume_tool_calls":
        ok = first is None or first.get("type") in ("save_point", "run_finished")
    elif action == "settle_aborted":
        ok = (
            finished is not None
            and finished.get("outcome") == "aborted"
            and not any(r.get("type") in ("provider_request_started", "tool_started") for r in recs)
        )
    elif action == "finish_run":
        ok = first is not None and first.get("type") == "run_finished"
        ok = ok and first is not None and first.get("outcome") in ("completed", "failed")
    else:  # park_failed_attempt_cap, fail_run_limit
        ok = (
            first is not None
            and first.get("type") == "run_finished"
            and first.get("outcome") == "failed"
            and first.get("reason") == lp.reason
        )
    if ok:
        return []
    shown = _evidence(first) or "nothing"
    return [f"lane {lp.lane}: planned {action}, log shows {shown} first"]
