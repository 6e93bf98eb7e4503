"""Recovery for callers: compute the plan (``recover``) and execute it (``resume``).

``recover`` takes a :mod:`~durable_harness.recovery.snapshot`, asks the tools' ``reconcile``
hooks (they only look) and calls the one decision function,
:func:`durable_harness.recovery.decide.plan`. ``resume`` does the same as the session's single
writer and hands each lane's planned step to the harness, which executes exactly that step
(``design/recovery.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from durable_harness import telemetry
from durable_harness.errors import RecoveryError, ToolError
from durable_harness.harness.records import idempotency_key
from durable_harness.providers.base import Provider
from durable_harness.providers.choice import ProviderChoice, choose_provider
from durable_harness.recovery.decide import (
    Policy,
    RecoveryPlan,
    ToolDeclaration,
    log_damaged,
    plan,
    resolve_decisions,
)
from durable_harness.recovery.snapshot import Snapshot, take_snapshot
from durable_harness.session.session import Session
from durable_harness.storage.base import SessionStore

if TYPE_CHECKING:  # imported where a run is resumed or a call reconciled: a plan needs none
    from durable_harness.harness.harness import Harness, HarnessOptions, RunHandle
    from durable_harness.tools.base import Tool, ToolResult


def declarations(tools: Mapping[str, Tool]) -> dict[str, ToolDeclaration]:
    """Return today's declarations (replay, reconcile hook) of ``tools``."""
    return {name: ToolDeclaration(t.replay, t.can_reconcile) for name, t in tools.items()}


async def probe_reconcile(
    snapshot: Snapshot, tools: Mapping[str, Tool], cwd: str | None = None
) -> dict[str, ToolResult | None]:
    """Ask the ``reconcile`` hook of every open call whose tool has one (in a run that is not
    being aborted) what it can establish; hooks only look, they never act. Returns
    ``{call key: result, or None when the hook cannot tell}``; a hook that raises
    :class:`ToolError` cannot tell."""
    out: dict[str, ToolResult | None] = {}
    damaged = log_damaged(snapshot.all_damage())
    for ls in snapshot.lanes:
        run = ls.run
        if run is None or run.abort_requested:
            continue
        for call in run.tool_calls:
            tool = tools.get(call.tool_name)
            unsure = call.status == "in_doubt" or (call.status == "not_started" and damaged)
            if not unsure or tool is None or not tool.can_reconcile:
                continue
            from durable_harness.tools.base import ToolContext  # loaded with any tool already

            ctx = ToolContext(
                cwd=Path(cwd or "."),
                run_id=run.run_id,
                tool_call_id=call.tool_call_id,
                idempotency_key=idempotency_key(run.run_id, call.key),
            )
            with telemetry.span(
                "durable_harness.recovery.reconcile",
                **{
                    "durable_harness.session.id": snapshot.session_id,
                    "durable_harness.lane": ls.lane.name,
                    "durable_harness.run.id": run.run_id,
                    "gen_ai.tool.name": call.tool_name,
                    "gen_ai.tool.call.id": call.tool_call_id,
                },
            ) as span:
                try:
                    result = await tool.reconcile(tool.parse_args(call.arguments), ctx)
                except ToolError:
                    result = None
                if span is not None:
                    span.set_attribute(
                        "durable_harness.outcome", "unknown" if result is None else "established"
                    )
            out[call.key] = result
    return out


@dataclass
class Recovery:
    """A plan and what it was computed from: the reconcile results its ``reconcile`` actions
    settle with (by call key) and the decisions it was given (by call key)."""

    plan: RecoveryPlan
    results: dict[str, ToolResult] = field(default_factory=dict)
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)


async def plan_recovery(
    store: SessionStore,
    tools: Mapping[str, Tool],
    policy: Policy = "ask",
    decisions: Mapping[str, Mapping[str, Any]] | None = None,
    cwd: str | None = None,
) -> Recovery:
    """Snapshot the store, ask the reconcile hooks, and plan: the :class:`Recovery` that
    :func:`resume_session` executes (pass it there so what was printed is what runs).

    Raises:
        RecoveryError: a decision names no call, or an ambiguous tool call id.
        StorageError: the store cannot be read.
    """
    with telemetry.span(
        "durable_harness.recovery.plan",
        **{"durable_harness.session.id": store.session_id, "durable_harness.policy": policy},
    ) as span:
        snapshot = take_snapshot(store)
        where = cwd or str(store.header.get("cwd") or ".")
        probed = await probe_reconcile(snapshot, tools, where)
        the_plan = plan(
            snapshot,
            declarations(tools),
            policy=policy,
            decisions=decisions,
            reconciled={k: v is not None for k, v in probed.items()},
        )
        given = resolve_decisions(snapshot, decisions or {}, declarations(tools))
        calls = {c.call_key: c for lp in the_plan.lanes for c in lp.tool_calls}
        for key, decision in given.items():
            call = calls.get(key)
            with telemetry.span(
                "durable_harness.recovery.decision",
                **{
                    "durable_harness.session.id": store.session_id,
                    "durable_harness.decision": str(decision.get("decision")),
                    "gen_ai.tool.name": call.tool_name if call else None,
                    "gen_ai.tool.call.id": call.tool_call_id if call else None,
                },
            ):
                pass
        if span is not None:
            span.set_attribute(
                "durable_harness.plan.actions",
                [f"{lp.lane}:{lp.next_action}" for lp in the_plan.lanes],
            )
            span.set_attribute(
                "durable_harness.plan.awaiting",
                [c.tool_call_id for lp in the_plan.lanes for c in lp.waiting()],
            )
    results = {k: v for k, v in probed.items() if v is not None}
    return Recovery(the_plan, results, given)


def _by_name(tools: Mapping[str, Tool] | list[Tool]) -> Mapping[str, Tool]:
    return tools if isinstance(tools, Mapping) else {t.name: t for t in tools}


def recover(
    store: SessionStore | Session,
    tools: Mapping[str, Tool] | list[Tool],
    *,
    policy: Policy = "ask",
    decisions: Mapping[str, Mapping[str, Any]] | None = None,
    cwd: str | None = None,
) -> RecoveryPlan:
    """Compute the recovery plan of an open session (read-only or writable; a
    :class:`Session` or its store): what ``resume`` would do, before anything runs. Reconcile
    hooks are asked (they only look). ``tools``: a list or ``{name: tool}``. ``cwd`` is where
    tools run (default: the session's working directory). Runs its own event loop (not
    callable from inside one: there, ``await`` :func:`plan_recovery`).

    Raises:
        RecoveryError: a decision names no call, or an ambiguous tool call id.
        StorageError: the store cannot be read.
    """
    source = store.store if isinstance(store, Session) else store
    planned = anyio.run(plan_recovery, source, _by_name(tools), policy, decisions, cwd)
    return planned.plan


def recorded_provider_spec(session: Session, lane: str = "main") -> str | None:
    """Return the provider spec recorded in the lane's open run (or latest run), if any."""
    for rec in reversed(session.store.records(lane, types=("run_started",))):
        spec = rec.get("providerSpec")
        if spec:
            return str(spec)
    return None


def resumed_provider(
    session: Session, lane: str = "main", given: str | None = None, default: str | None = None
) -> ProviderChoice | None:
    """The provider a resumed run of ``lane`` uses: :func:`~durable_harness.providers.choice.
    choose_provider` over ``given``, the spec the lane recorded and the lane's model (the one
    rule, ``design/run-loop.md``); ``None`` when there is no spec at all."""
    return choose_provider(
        given,
        recorded_provider_spec(session, lane),
        session.context(lane=lane).model,
        default,
    )


def parse_decision(text: str) -> tuple[str, dict[str, Any]]:
    """Parse ``TOOL_CALL_ID=retry|retry!|fail|result:TEXT`` into ``(id, {"decision",
    "result"})``. ``retry!`` is a forced retry (``{"decision": "retry", "force": True}``): it
    re-runs a call whose process group was recorded on another machine and may still run there
    (``durable_harness.recovery.remote``).

    Raises:
        RecoveryError: malformed.
    """
    call_id, sep, value = text.partition("=")
    if not sep or not call_id:
        raise RecoveryError(f"decision {text!r} must look like TOOL_CALL_ID=retry|fail|result:TEXT")
    if value == "retry!":
        return call_id, {"decision": "retry", "force": True}
    if value in ("retry", "fail"):
        return call_id, {"decision": value}
    if value.startswith("result:"):
        return call_id, {"decision": "result", "result": value[len("result:") :]}
    raise RecoveryError(f"decision {text!r}: the value must be retry, retry!, fail or result:TEXT")


async def resume_session(
    session: Session,
    tools: Mapping[str, Tool],
    *,
    provider: Provider | None = None,
    decisions: Mapping[str, Mapping[str, Any]] | None = None,
    policy: Policy = "ask",
    options: HarnessOptions | None = None,
    lanes: list[str] | None = None,
    recovery: Recovery | None = None,
    price: Mapping[str, Any] | None = None,
    on_event: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, str]:
    """:func:`resume` with ``tools`` by name, plus what a host or the CLI passes: the
    ``recovery`` already planned (by :func:`plan_recovery` on this open session, with the same
    decisions: what was printed is what runs), the ``price`` (table) a provider rebuilt from
    its recorded spec charges (:func:`~durable_harness.providers.parse_price`), and
    ``on_event``, subscribed to each resumed run's harness events (:meth:`Harness.subscribe`:
    the CLI streams a resumed run as ``run`` does). Returns and raises as :func:`resume`.
    """
    from durable_harness.harness.harness import Harness, HarnessOptions
    from durable_harness.providers import make_provider

    results: dict[str, str] = {}
    names = lanes or sorted(session.store.lanes())
    cwd = str(session.cwd) if session.cwd else None
    rec = recovery or await plan_recovery(session.store, tools, policy, decisions, cwd)
    opts = options or HarnessOptions()
    for lane in names:
        lane_plan = rec.plan.lane(lane)
        step = lane_plan.step()
        if step.action == "none":
            results[lane] = "idle"
            continue
        prov = provider
        if prov is None:
            choice = resumed_provider(session, lane)
            if choice is None:
                if lane_plan.run_id is None:
                    results[lane] = "idle"
                    continue
                raise RecoveryError(
                    f"run {lane_plan.run_id} of session {session.id} recorded no "
                    "provider; pass --provider"
                )
            prov = make_provider(choice.spec, price)
            opts.provider_spec = choice.spec
        async with Harness(session, prov, dict(tools), options=opts) as harness:
            if on_event is not None:
                harness.subscribe(on_event)
            handle = await resume_lane(harness, rec, lane)
            results[lane] = await handle.wait() if handle is not None else "idle"
    return results


async def resume_lane(harness: Harness, recovery: Recovery, lane: str = "main") -> RunHandle | None:
    """Hand one lane's planned step, with the decisions and reconcile results it was planned
    with, to ``harness`` (whose session is the one ``recovery`` was planned on, open for
    writing). Returns the run's handle, or ``None`` when nothing was started.

    Raises:
        KeyError: the plan has no such lane.
        RecoveryError: the plan no longer matches the stored run.
    """
    lane_plan = recovery.plan.lane(lane)
    keys = {c.call_key for c in lane_plan.tool_calls}
    return await harness.resume(
        lane_plan.step(),
        lane=lane,
        decisions={k: v for k, v in recovery.decisions.items() if k in keys},
        results={k: v for k, v in recovery.results.items() if k in keys},
    )


async def resume(
    session: Session,
    tools: Mapping[str, Tool] | list[Tool],
    *,
    provider: Provider | None = None,
    decisions: Mapping[str, Mapping[str, Any]] | None = None,
    policy: Policy = "ask",
    options: HarnessOptions | None = None,
    lanes: list[str] | None = None,
) -> dict[str, str]:
    """Resume a session's interrupted runs: plan recovery once (as :func:`recover` shows it,
    ``design/recovery.md``), then have the harness execute exactly each lane's planned step.

    ``session`` is open for writing (the caller closes it); ``tools`` a list or ``{name:
    tool}`` (their ``replay`` and ``reconcile`` decide what may be re-run); ``provider``
    defaults to one rebuilt from the spec the run recorded; ``decisions`` (``{call key or tool
    call id: {"decision": "retry"|"fail"|"result", "result": text}}``) are each durable before
    they act; ``policy``: :data:`~durable_harness.recovery.decide.Policy`; ``options``: for the
    resumed runs; ``lanes``: only these (default: all). Returns ``{lane: outcome}``:
    ``completed``, ``aborted``, ``failed``, ``suspended`` (awaiting a decision) or ``idle``.

    Raises:
        RecoveryError: a decision names no call in doubt, or no provider was given and none
            is recorded.
        StorageError: the store cannot be read or written.
    """
    return await resume_session(
        session,
        _by_name(tools),
        provider=provider,
        decisions=decisions,
        policy=policy,
        options=options,
        lanes=lanes,
    )
