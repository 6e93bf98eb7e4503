"""Applying a recovery plan: open the session as its single writer and continue each
interrupted run from its last safe boundary (the library form of ``durable-harness resume``).
"""

from __future__ import annotations

from typing import Any

from durable_harness.errors import RecoveryError
from durable_harness.harness.harness import Harness, HarnessOptions, Policy
from durable_harness.providers import make_provider
from durable_harness.providers.base import Provider
from durable_harness.recovery.plan import RecoveryPlan, ToolDeclaration, plan, take_snapshot
from durable_harness.session.session import Session
from durable_harness.storage.base import SessionStore
from durable_harness.tools.base import Tool


def declarations(tools: dict[str, Tool]) -> dict[str, ToolDeclaration]:
    """Return today's declarations (replay, reconcile hook) of ``tools``."""
    return {name: ToolDeclaration(t.replay, t.can_reconcile) for name, t in tools.items()}


def recover(store: SessionStore, tools: dict[str, Tool], *, policy: Policy = "ask",
            decisions: dict[str, dict[str, Any]] | None = None,
            attempt_cap: int = 5) -> RecoveryPlan:
    """Compute the recovery plan of an open session (read-only or writable): no effect runs."""
    return plan(take_snapshot(store), declarations(tools), policy=policy, decisions=decisions,
                attempt_cap=attempt_cap)


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
        return call_id, {"decision": "result", "result": value[len("result:"):]}
    raise RecoveryError(f"decision {text!r}: the value must be retry, fail or result:TEXT")


async def resume_session(session: Session, tools: dict[str, Tool], *,
                         provider: Provider | None = None,
                         decisions: dict[str, dict[str, Any]] | None = None,
                         policy: Policy = "ask", options: HarnessOptions | None = None,
                         lanes: list[str] | None = None) -> dict[str, str]:
    """Resume every interrupted run (or those of ``lanes``) of a session opened for writing.

    Returns ``{lane: outcome}`` with outcome ``completed``, ``aborted``, ``failed`` or
    ``suspended`` (still awaiting a decision), or ``idle`` for a lane with nothing to do.

    Raises:
        RecoveryError: no provider was given and none is recorded in the run.
    """
    results: dict[str, str] = {}
    names = lanes or sorted(session.store.lanes())
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
                raise RecoveryError(f"run {state.run_id} of session {session.id} recorded no "
                                    "provider; pass --provider")
            prov = make_provider(spec)
            opts.provider_spec = spec
        async with Harness(session, prov, tools, options=opts) as harness:
            handle = await harness.resume(lane=lane, decisions=decisions, policy=policy)
            results[lane] = await handle.wait() if handle is not None else "idle"
    return results
