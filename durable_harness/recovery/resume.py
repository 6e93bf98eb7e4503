"""Applying a recovery plan: open the session as its single writer and continue each
interrupted run from its last safe boundary (the library form of ``durable-harness resume``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from durable_harness.errors import RecoveryError, ToolError
from durable_harness.harness.harness import Harness, HarnessOptions, Policy
from durable_harness.harness.records import idempotency_key
from durable_harness.providers import make_provider
from durable_harness.providers.base import Provider
from durable_harness.recovery.plan import (
    RecoveryPlan,
    Snapshot,
    ToolDeclaration,
    plan,
    take_snapshot,
)
from durable_harness.session.session import Session
from durable_harness.storage.base import SessionStore
from durable_harness.tools.base import Tool, ToolContext


def declarations(tools: dict[str, Tool]) -> dict[str, ToolDeclaration]:
    """Return today's declarations (replay, reconcile hook) of ``tools``."""
    return {name: ToolDeclaration(t.replay, t.can_reconcile) for name, t in tools.items()}


async def probe_reconcile(
    snapshot: Snapshot, tools: dict[str, Tool], cwd: str | None = None
) -> dict[str, bool]:
    """Ask the ``reconcile`` hook of every in-doubt call whose tool has one whether it can
    establish the outcome (hooks only look; they never act). Returns ``{tool_call_id: bool}``."""
    out: dict[str, bool] = {}
    for ls in snapshot.lanes:
        run = ls.run
        if run is None:
            continue
        for call in run.tool_calls:
            tool = tools.get(call.tool_name)
            if call.status != "in_doubt" or tool is None or not tool.can_reconcile:
                continue
            ctx = ToolContext(
                cwd=Path(cwd or "."),
                run_id=run.run_id,
                tool_call_id=call.tool_call_id,
                idempotency_key=idempotency_key(run.run_id, call.tool_call_id),
            )
            try:
                result = await tool.reconcile(tool.parse_args(call.arguments), ctx)
            except ToolError:
                result = None
            out[call.tool_call_id] = result is not None
    return out


async def recover_async(
    store: SessionStore,
    tools: dict[str, Tool],
    *,
    policy: Policy = "ask",
    decisions: dict[str, dict[str, Any]] | None = None,
    attempt_cap: int = 5,
    cwd: str | None = None,
) -> RecoveryPlan:
    """Compute the recovery plan of an open session (read-only or writable). No effect runs;
    reconcile hooks are asked (they only look) so the plan can say which calls need a decision.
    ``cwd`` is where tools run (default: the session's working directory)."""
    snapshot = take_snapshot(store)
    where = cwd or str(store.header.get("cwd") or ".")
    reconciled = await probe_reconcile(snapshot, tools, where)
    return plan(
        snapshot,
        declarations(tools),
        policy=policy,
        decisions=decisions,
        attempt_cap=attempt_cap,
        reconciled=reconciled,
    )


def recover(
    store: SessionStore,
    tools: dict[str, Tool],
    *,
    policy: Policy = "ask",
    decisions: dict[str, dict[str, Any]] | None = None,
    attempt_cap: int = 5,
    cwd: str | None = None,
) -> RecoveryPlan:
    """:func:`recover_async` for synchronous callers (runs its own event loop: not callable
    from inside one)."""
    return anyio.run(
        lambda: recover_async(
            store, tools, policy=policy, decisions=decisions, attempt_cap=attempt_cap, cwd=cwd
        )
    )


def recorded_provider_spec(session: Session, lane: str = "main") -> str | None:
    """Return the provider spec recorded in the lane's open run (or latest run), if any."""
    for rec in reversed(session.store.records(lane, types=("run_started",))):
        spec = rec.get("providerSpec")
        if spec:
            return str(spec)
    return None


def parse_decision(text: str) -> tuple[str, dict[str, Any]]:
    """Parse ``TOOL_CALL_ID=retry|fail|result:TEXT`` into ``(id, {"decision", "result"})``.

    Raises:
        RecoveryError: malformed.
    """
    call_id, sep, value = text.partition("=")
    if not sep or not call_id:
        raise RecoveryError(f"decision {text!r} must look like TOOL_CALL_ID=retry|fail|result:TEXT")
    if value in ("retry", "fail"):
        return call_id, {"decision": value}
    if value.startswith("result:"):
        return call_id, {"decision": "result", "result": value[len("result:") :]}
    raise RecoveryError(f"decision {text!r}: the value must be retry, fail or result:TEXT")


async def resume_session(
    session: Session,
    tools: dict[str, Tool],
    *,
    provider: Provider | None = None,
    decisions: dict[str, dict[str, Any]] | None = None,
    policy: Policy = "ask",
    options: HarnessOptions | None = None,
    lanes: list[str] | None = None,
) -> dict[str, str]:
    """Resume every interrupted run (or those of ``lanes``) of a session opened for writing.

    Returns ``{lane: outcome}`` with outcome ``completed``, ``aborted``, ``failed`` or
    ``suspended`` (still awaiting a decision), or ``idle`` for a lane with nothing to do.

    Raises:
        RecoveryError: no provider was given and none is recorded in the run.
    """
    results: dict[str, str] = {}
    names = lanes or sorted(session.store.lanes())
    if decisions:
        current = plan(take_snapshot(session.store), declarations(tools), policy=policy)
        open_calls = {
            c.tool_call_id
            for lp in current.lanes
            for c in lp.tool_calls
            if c.action not in ("execute", "none", "abort")
        }
        unknown = sorted(set(decisions) - open_calls)
        if unknown:
            raise RecoveryError(
                f"no tool call awaiting a decision is named {', '.join(unknown)} in session "
                f"{session.id} (a call not yet started needs none); in doubt: "
                f"{', '.join(sorted(open_calls)) or 'none'} (see `durable-harness recover`)",
                unknown=unknown,
                open_calls=sorted(open_calls),
            )
    opts = options or HarnessOptions()
    opts.policy = policy
    for lane in names:
        state = session.lane(lane)
        prov = provider
        if prov is None:
            spec = recorded_provider_spec(session, lane)
            if spec is None:
                if state.run_id is None:
                    results[lane] = "idle"
                    continue
                raise RecoveryError(
                    f"run {state.run_id} of session {session.id} recorded no "
                    "provider; pass --provider"
                )
            prov = make_provider(spec)
            opts.provider_spec = spec
        async with Harness(session, prov, tools, options=opts) as harness:
            handle = await harness.resume(lane=lane, decisions=decisions, policy=policy)
            results[lane] = await handle.wait() if handle is not None else "idle"
    return results
