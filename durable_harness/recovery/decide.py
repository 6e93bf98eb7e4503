"""The one decision function: from a snapshot of storage, today's tool declarations and the
policy, decide every lane and every open tool call of a session after a crash.

:func:`plan` is pure (no I/O, no clock): it reads only the :class:`Snapshot`. ``recover``
prints its result; ``resume`` hands each lane's step to the harness, which executes exactly
that step and nothing else (``design/recovery.md``). The lane-level order of steps is the run
loop's own :func:`durable_harness.harness.steps.next_step`; this module adds what only
recovery knows: calls in doubt, damage, decisions, policies and reconcile hooks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from durable_harness.errors import AlreadyDecided, RecoveryError
from durable_harness.harness.state import RunLimits, ToolCallState
from durable_harness.harness.steps import CallAction, LaneAction, Step, next_step
from durable_harness.models.records import RunLimit
from durable_harness.recovery.remote import check_remote_retries
from durable_harness.recovery.snapshot import LaneSnapshot, Snapshot
from durable_harness.storage.damage import WARNING_KINDS

#: How in-doubt calls without a decision are settled (``design/recovery.md``, Policies).
Policy = Literal["ask", "fail-in-doubt", "retry-safe"]
POLICIES: tuple[Policy, ...] = get_args(Policy)

#: A lane's state in the plan.
LaneStatus = Literal["idle", "suspended", "running"]

#: A call's status in the plan: ``in_doubt`` covers an intent without settlement and, on a
#: damaged log, a call whose intent may have been lost (``doubt`` says which).
CallStatus = Literal["not_started", "in_doubt", "completed"]

#: Damage kinds that do not make the log untrustworthy: a torn tail is the expected shape of
#: a crash mid-write (its line was never acknowledged); a replaced lone surrogate changes text,
#: not the record sequence.
BENIGN_DAMAGE: frozenset[str] = WARNING_KINDS | {"torn_tail"}

DecisionKind = Literal["retry", "fail", "result"]


def log_damaged(damage: Iterable[Mapping[str, Any]]) -> bool:
    """True when some damage means a missing record proves nothing: "no ``tool_started``
    found" may then be an intent that was lost, so a call that is not replay-safe counts as in
    doubt. The one definition, used by the plan, ``fsck`` and the CLI."""
    return any(d.get("kind") not in BENIGN_DAMAGE for d in damage)


@dataclass(frozen=True)
class ToolDeclaration:
    """What the planner needs to know of a tool today: ``replay`` (``safe`` or ``never``) and
    whether it has a ``reconcile`` hook."""

    replay: str
    can_reconcile: bool = False


@dataclass
class ToolCallPlan:
    """One open or settled tool call of a run's latest turn.

    Contract fields ``tool_call_id``, ``tool_name``, ``status``, ``replay``, ``action``; plus
    ``call_key`` (the call's identity in the run, ``"<entry id>/<index>"``: decisions may name
    it or an unambiguous ``tool_call_id``), ``doubt`` (``intent_unsettled`` or ``damaged_log``
    for a call in doubt), ``attempts`` (intents so far), ``declared_replay`` (today's
    declaration), ``decision`` (recorded or given), ``arguments``, ``process`` (a recorded
    process group and whether it is alive).
    """

    tool_call_id: str
    tool_name: str
    status: CallStatus
    replay: str | None
    action: CallAction
    call_key: str = ""
    doubt: str | None = None
    attempts: int = 0
    declared_replay: str | None = None
    decision: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    process: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """The call key (what :mod:`durable_harness.recovery.decisions` names a call by)."""
        return self.call_key

    @property
    def kills_group(self) -> bool:
        """True when resume kills this call's process group before it acts: the call is open
        and its group, recorded on this machine, was alive when the plan was made
        (``process.alive``). The plan's one statement of the kill (``design/recovery.md``,
        "Process groups left running"): ``recover`` prints it, a host kills such groups
        before it offers a plan, and :func:`~durable_harness.recovery.audit.plan_followed`
        accepts resume's ``tool_process_killed`` only for these calls. The group's harness is
        dead, so a group not alive at planning is not alive at resume; one alive at planning
        may end by itself before resume reaches it (then nothing is killed or recorded)."""
        return self.status != "completed" and (self.process or {}).get("alive") is True


@dataclass
class LanePlan:
    """One lane's plan.

    Contract fields ``lane``, ``state``, ``run_id``, ``abort_requested``, ``next_action``,
    ``tool_calls``; plus ``reason``, ``limit`` (the run limit a failing step enforces),
    ``purpose`` (of a provider request step),
    ``request_key`` (the attempt counter of the request in flight, if any), the provider
    attempts per counter (``"turn 2"``, ``"compaction 2"``) and their cap, the run's limits,
    the last safe boundary, the number of attempts whose cost is unknown (never counted as
    zero), queued items, deferred writes and the lane's last settled run.
    """

    lane: str
    state: LaneStatus
    run_id: str | None
    abort_requested: bool
    next_action: LaneAction
    tool_calls: list[ToolCallPlan] = field(default_factory=list)
    reason: str | None = None
    purpose: str = "turn"
    limit: RunLimit | None = None
    request_key: str | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    attempt_cap: int = RunLimits().attempt_cap
    limits: dict[str, int] = field(default_factory=dict)
    last_safe_boundary: dict[str, Any] | None = None
    cost_unknown_attempts: int = 0
    queued: list[dict[str, Any]] = field(default_factory=list)
    deferred_writes: list[str] = field(default_factory=list)
    last_run: dict[str, Any] | None = None

    def step(self) -> Step:
        """The harness step this lane plan orders (what ``resume`` executes)."""
        calls = {c.call_key: c.action for c in self.tool_calls if c.status != "completed"}
        return Step(self.next_action, calls, self.reason, self.purpose, self.limit)

    def waiting(self) -> list[ToolCallPlan]:
        """The calls that wait for a decision."""
        return [c for c in self.tool_calls if c.action == "await_decision"]


@dataclass
class RecoveryPlan:
    """The plan: ``session_id``, ``lanes``, ``damage`` (contract: storage damage and states a
    single writer cannot produce, each with ``kind`` and a location), ``damaged`` (whether the
    damage makes missing records meaningless), plus ``lease`` (the live holder, if any)."""

    session_id: str
    lanes: list[LanePlan]
    damage: list[dict[str, Any]]
    lease: dict[str, Any] | None = None
    damaged: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form printed by ``durable-harness recover --json``."""
        return asdict(self)

    def lane(self, name: str) -> LanePlan:
        """Return one lane's plan.

        Raises:
            KeyError: no such lane.
        """
        for lp in self.lanes:
            if lp.lane == name:
                return lp
        raise KeyError(name)

    def open_calls(self) -> list[ToolCallPlan]:
        """Every call of every lane that a decision could apply to (not settled, not plainly
        unstarted, not aborted)."""
        return [
            c
            for lp in self.lanes
            for c in lp.tool_calls
            if c.status == "in_doubt" and c.action != "abort"
        ]


def in_doubt(call: ToolCallState, declared: str | None, damaged: bool) -> str | None:
    """Why ``call`` is in doubt, or ``None``: ``intent_unsettled`` (an intent without its
    settlement), ``damaged_log`` (not started as far as the log shows, but the log lost records,
    so its intent may be among them; a tool declared replay-safe today is run again instead).
    The one definition, used by the plan and by :func:`resolve_decisions`."""
    if call.status == "in_doubt":
        return "intent_unsettled"
    if call.status == "not_started" and damaged and declared != "safe":
        return "damaged_log"
    return None


def resolve_decisions(
    snapshot: Snapshot,
    decisions: Mapping[str, Mapping[str, Any]],
    tools: Mapping[str, ToolDeclaration],
) -> dict[str, dict[str, Any]]:
    """Key decisions by call key: the one rule of what a decision may name.

    A decision names a call a decision can settle: one :func:`in_doubt` in a run that is not
    being aborted (an abort settles its calls itself; a call not started needs no decision,
    it runs; a finished one has its result), whose current attempt has no decision on record
    (a decision, once durable, is never replaced: ``design/recovery.md``, "Attempts"). It
    names it by call key, or by a tool call id that names exactly one such call. ``tools``:
    today's declarations (a not-started call on a damaged log is in doubt unless its tool is
    replay-safe).

    Raises:
        AlreadyDecided: a name is a call of an open run whose current attempt was decided
            already (in doubt still, or settled by that decision); ``details`` name the call
            and the decision on record.
        RecoveryError: a name matches no call in doubt (the message names it and lists the
            calls that can be decided, ``details['in_doubt']`` their tool call ids and
            ``details['call_keys']`` their keys), a tool call id matches several (the error
            lists the call keys to use instead), or two names are the same call.
    """
    damaged = log_damaged(snapshot.all_damage())
    calls = [
        c
        for ls in snapshot.lanes
        if ls.run is not None and not ls.run.abort_requested
        for c in ls.run.tool_calls
        if in_doubt(c, _declared(tools, c.tool_name), damaged)
    ]
    out: dict[str, dict[str, Any]] = {}
    unknown: list[str] = []
    for name, decision in decisions.items():
        by_key = [c for c in calls if c.key == name]
        matches = by_key or [c for c in calls if c.tool_call_id == name]
        if len(matches) > 1:
            raise RecoveryError(
                f"tool call id {name!r} names {len(matches)} calls in session "
                f"{snapshot.session_id}; decide by call key: " + ", ".join(c.key for c in matches),
                ambiguous=name,
                call_keys=[c.key for c in matches],
            )
        if matches and matches[0].decision is not None:
            raise _already_decided(snapshot, matches[0], decision)
        if not matches:
            refuse_decided(snapshot, name, decision)
            unknown.append(name)
            continue
        if matches[0].key in out:
            raise RecoveryError(
                f"two decisions name tool call {matches[0].tool_call_id} ({matches[0].key}) "
                f"in session {snapshot.session_id}; give one",
                session_id=snapshot.session_id,
                call_key=matches[0].key,
            )
        out[matches[0].key] = dict(decision)
    if unknown:
        known = ", ".join(f"{c.tool_call_id} ({c.key})" for c in calls)
        raise RecoveryError(
            f"no tool call in doubt is named {', '.join(map(repr, unknown))} in session "
            f"{snapshot.session_id} (a call not started needs no decision; a finished or "
            f"aborted one takes none); "
            + (f"in doubt: {known}" if calls else "no call of it is in doubt")
            + " (see `durable-harness recover`)",
            session_id=snapshot.session_id,
            tool_call_id=unknown[0],
            unknown=unknown,
            in_doubt=[c.tool_call_id for c in calls],
            call_keys=[c.key for c in calls],
        )
    return out


def refuse_decided(snapshot: Snapshot, name: str, given: Mapping[str, Any]) -> None:
    """Refuse ``given`` when ``name`` (a call key, or a tool call id naming one call) is a
    call of an open run's current turn whose current attempt has a decision on record (still
    in doubt, or settled by it). Part of :func:`resolve_decisions`; the host also asks it of
    a session that is live (so a second decision reads ``already_decided`` there too).

    Raises:
        AlreadyDecided: naming the call, its attempt and the decision on record.
    """
    calls = [c for ls in snapshot.lanes if ls.run is not None for c in ls.run.tool_calls]
    named = [c for c in calls if c.key == name] or [c for c in calls if c.tool_call_id == name]
    if len(named) == 1 and named[0].decision is not None:
        raise _already_decided(snapshot, named[0], given)


def _already_decided(
    snapshot: Snapshot, call: ToolCallState, given: Mapping[str, Any]
) -> AlreadyDecided:
    """The refusal of ``given`` for ``call``, whose current attempt was decided already."""
    ls = next(
        ls
        for ls in snapshot.lanes
        if ls.run is not None and any(c is call for c in ls.run.tool_calls)
    )
    assert ls.run is not None
    held = dict(call.decision or {})
    on_record = {"decision": held.get("decision"), "seq": call.decided_seq}
    if held.get("decision") == "result":
        on_record["result"] = held.get("result")
    shown = str(held.get("decision")) + (
        f":{str(held.get('result'))[:80]}" if held.get("decision") == "result" else ""
    )
    settled = " and settled by it" if call.status == "completed" else ""
    return AlreadyDecided(
        f"tool call {call.tool_call_id} ({call.key}) of run {ls.run.run_id} in session "
        f"{snapshot.session_id} was already decided {shown!r} (record seq {call.decided_seq}, "
        f"attempt {call.attempts}){settled}; a decision on record is never replaced, so "
        f"{given.get('decision')!r} was refused and nothing was written",
        session_id=snapshot.session_id,
        lane=ls.lane.name,
        run_id=ls.run.run_id,
        tool_call_id=call.tool_call_id,
        call_key=call.key,
        attempt=call.attempts,
        on_record=on_record,
        given={k: v for k, v in given.items() if k != "author"},  # what, not who
    )


def _declared(tools: Mapping[str, ToolDeclaration], name: str) -> str | None:
    decl = tools.get(name)
    return decl.replay if decl is not None else None


def plan(
    snapshot: Snapshot,
    tools: Mapping[str, ToolDeclaration],
    *,
    policy: Policy = "ask",
    decisions: Mapping[str, Mapping[str, Any]] | None = None,
    reconciled: Mapping[str, bool] | None = None,
) -> RecoveryPlan:
    """Decide every lane and open tool call of the session (pure).

    Args:
        snapshot: from :func:`durable_harness.recovery.snapshot.take_snapshot`.
        tools: today's tool declarations by name.
        policy: ``ask`` (wait for decisions), ``retry-safe`` (never wait: fail what cannot be
            re-run or reconciled), ``fail-in-doubt`` (fail every in-doubt call).
        decisions: ``{call key or tool call id: {"decision": "retry"|"fail"|"result",
            "result": text}}`` about to be given (recorded decisions come from the log).
        reconciled: ``{call key: could the reconcile hook tell?}``, from asking the hooks;
            a call whose hook could not tell needs a decision.

    Raises:
        RecoveryError: a decision names no call in doubt, or an ambiguous tool call id
            (:func:`resolve_decisions`). ToolProcessElsewhere: an unforced ``retry`` of a
            call whose group may still run on another machine (:mod:`.remote`).
    """
    given = resolve_decisions(snapshot, decisions or {}, tools)
    check_remote_retries(snapshot, given)
    reconciled = reconciled or {}
    damage = snapshot.all_damage()
    damaged = log_damaged(damage)
    lanes = [
        _lane_plan(ls, snapshot, tools, policy, given, reconciled, damaged) for ls in snapshot.lanes
    ]
    return RecoveryPlan(snapshot.session_id, lanes, damage, snapshot.lease, damaged)


def _lane_plan(
    ls: LaneSnapshot,
    snapshot: Snapshot,
    tools: Mapping[str, ToolDeclaration],
    policy: Policy,
    given: Mapping[str, Mapping[str, Any]],
    reconciled: Mapping[str, bool],
    damaged: bool,
) -> LanePlan:
    queued = [{"queue": q.queue, "itemId": q.item_id} for q in ls.log.queue]
    deferred = [str(d["id"]) for d in ls.log.deferred]
    run = ls.run
    if run is None:
        nxt: LaneAction = "start_next_run" if ls.log.pending("next_run") else "none"
        return LanePlan(
            ls.lane.name,
            "idle",
            None,
            False,
            nxt,
            queued=queued,
            deferred_writes=deferred,
            last_run=ls.last_run,
        )
    calls = [
        _call_plan(
            c,
            tools.get(c.tool_name),
            policy,
            given.get(c.key),
            run.abort_requested,
            reconciled.get(c.key),
            damaged,
        )
        for c in run.tool_calls
    ]
    step = next_step(run, ls.log, {c.call_key: c.action for c in calls})
    lp = LanePlan(
        ls.lane.name,
        "suspended",
        run.run_id,
        run.abort_requested,
        step.action,
        calls,
        reason=step.reason or ("awaiting_decision" if step.action == "await_decision" else "crash"),
        purpose=step.purpose,
        limit=step.limit,
        request_key=run.pending.key if run.pending else None,
        attempts=dict(run.attempts),
        attempt_cap=run.limits.attempt_cap,
        limits=run.limits.to_record(),
        last_safe_boundary=_boundary(ls.run_records),
        cost_unknown_attempts=run.cost_unknown_attempts + (1 if run.pending is not None else 0),
        queued=queued,
        deferred_writes=deferred,
    )
    if snapshot.lease is not None:
        lp.state, lp.reason, lp.next_action = "running", None, "none_held_by_live_process"
    return lp


def _boundary(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    safe = ("run_started", "save_point", "provider_request_finished", "tool_finished")
    for rec in reversed(list(records)):
        if rec.get("type") in safe:
            return {"seq": rec["seq"], "type": rec["type"]}
    return None


def _call_plan(
    call: ToolCallState,
    decl: ToolDeclaration | None,
    policy: Policy,
    decision: Mapping[str, Any] | None,
    aborting: bool,
    reconciled: bool | None,
    damaged: bool,
) -> ToolCallPlan:
    declared = decl.replay if decl else None
    doubt = in_doubt(call, declared, damaged)
    status: CallStatus = "in_doubt" if doubt is not None else call.status
    cp = ToolCallPlan(
        call.tool_call_id,
        call.tool_name,
        status,
        call.replay if call.status != "not_started" else declared,
        "none",
        call.key,
        doubt,
        call.attempts,
        declared,
        arguments=dict(call.arguments),
        process=call.process,
    )
    decision = decision or call.decision
    if status == "completed":
        return cp
    if aborting:
        cp.action = "abort"
    elif status == "not_started":
        cp.action = "execute" if decl is not None else "reject"
    elif decision is not None:
        cp.decision = dict(decision)
        retry = decision.get("decision") == "retry"
        cp.action = ("re-execute" if decl is not None else "reject") if retry else "apply_decision"
    elif policy == "fail-in-doubt":
        cp.action = "fail"
    elif call.status == "in_doubt" and call.replay == "safe" and declared == "safe":
        cp.action = "re-execute"
    elif decl is not None and decl.can_reconcile and reconciled is True:
        cp.action = "reconcile"
    elif policy == "retry-safe":
        cp.action = "fail"
    else:
        cp.action = "await_decision"
    return cp
