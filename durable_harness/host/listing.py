"""Listing sessions: a record plus its recovery plan at a glance, written once for the host
(``GET /sessions``) and the CLI (``durable-harness sessions``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from durable_harness.errors import InvalidRequest
from durable_harness.host.lifecycle import STATES, State
from durable_harness.host.record import CommandRuntime, SessionRecord, read_record
from durable_harness.recovery.decide import Policy, RecoveryPlan
from durable_harness.recovery.explain import why_in_doubt
from durable_harness.recovery.resume import plan_recovery
from durable_harness.storage.base import SessionStore

if TYPE_CHECKING:
    from durable_harness.tools.base import Tool

ARGUMENTS_INLINE_BYTES = 1024
"""A waiting call's arguments are listed up to this many bytes of JSON; longer ones as a
digest (the full arguments are in the session's plan)."""


async def read_listed(
    store: SessionStore,
    spec: str,
    tools: Callable[[CommandRuntime], Mapping[str, Tool]],
    policy: Policy = "ask",
) -> tuple[SessionRecord, RecoveryPlan | None]:
    """The record of an open session (``spec``: its store's spec) and, when ``suspended``,
    its recovery plan with today's ``tools`` and ``policy``. Writes nothing.

    Raises:
        StorageError: the session cannot be read.
    """
    alive = store.lease_holder() is not None
    rec = read_record(store, spec, owner_alive=alive)
    if rec.state != "suspended":
        return rec, None
    recovery = await plan_recovery(store, tools(rec.command_runtime), policy, None, None)
    return rec, recovery.plan


def arguments_digest(arguments: Any) -> str:
    """``sha256:<hex>`` of a call's arguments as canonical JSON (keys sorted, no spaces,
    UTF-8: the bytes ``orjson`` writes with ``OPT_SORT_KEYS``); the one digest the listing,
    the pages and the notices show (``design/notify.md``)."""
    raw = orjson.dumps(arguments or {}, option=orjson.OPT_SORT_KEYS, default=str)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def waiting_calls(
    plan: RecoveryPlan | None, started_at: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The calls ``plan`` waits on for a decision, in lane order: ``{"lane", "run_id",
    "tool_name", "tool_call_id", "call_key", "attempt", "doubt", "why"}`` (``why``: the doubt
    in plain words, :func:`~durable_harness.recovery.explain.why_in_doubt`) plus
    ``arguments`` (at most :data:`ARGUMENTS_INLINE_BYTES` of JSON) or ``arguments_digest``
    and ``arguments_bytes``. ``started_at``: ``{call key: timestamp of its latest
    tool_started}``, for the hour in ``why``."""
    out: list[dict[str, Any]] = []
    for lp in plan.lanes if plan is not None else []:
        for call in lp.waiting():
            item: dict[str, Any] = {
                "lane": lp.lane,
                "run_id": lp.run_id,
                "tool_name": call.tool_name,
                "tool_call_id": call.tool_call_id,
                "call_key": call.call_key,
                "attempt": call.attempts,
                "doubt": call.doubt,
                "why": why_in_doubt(call, (started_at or {}).get(call.call_key)),
            }
            args = call.arguments or {}
            raw = orjson.dumps(args, option=orjson.OPT_SORT_KEYS, default=str)
            if len(raw) <= ARGUMENTS_INLINE_BYTES:
                item["arguments"] = args
            else:
                item["arguments_digest"] = arguments_digest(args)
                item["arguments_bytes"] = len(raw)
            out.append(item)
    return out


def check_states(states: Iterable[str] | None) -> frozenset[State] | None:
    """The states a listing is filtered to (``None``: no filter); :class:`InvalidRequest`
    for a value that is no lifecycle state."""
    if not states:
        return None
    chosen = list(states)
    bad = [s for s in chosen if s not in STATES]
    if bad:
        raise InvalidRequest(
            f"state {bad[0][:100]!r} is not a session state ({', '.join(STATES)})",
            state=bad[0][:100],
            states=list(STATES),
        )
    return frozenset(s for s in STATES if s in chosen)
