"""The host's part in process groups left running by a dead generation: kill them before a
plan is offered, and the operator's kill (``design/host.md``, "What happens to a running
tool's group").

A ``bash`` call's group outlives a SIGKILLed host (it is its own process group). Whatever
reads a suspended session (start-up reconciliation, a PostgreSQL worker's claim, any later
read of a session another host left suspended) must not offer a plan while that group can
still land its effect: the plan would say "in doubt" of a call that is still running, and a
``retry`` would run it twice at once. So the host kills, under the session's writer lease
(which proves the generation that started the group dead), every live group the open runs
recorded on this machine, records each kill (``tool_process_killed``), and only then plans.
A group recorded on another machine is reported with its host and pid, never signalled
(``durable_harness.recovery.remote`` refuses an unforced retry of its call).

The operator can also kill one call's group without deciding anything
(:func:`kill_call_group`: ``POST /sessions/{id}/agent/kill``, the console's "Kill it"): the
call stays in doubt, its plan says the group is gone.
"""

from __future__ import annotations

from durable_harness.errors import InvalidRequest, LeaseHeld, SessionLive
from durable_harness.harness.groups import (
    KilledBy,
    kill_and_record,
    open_calls,
    recorded_group,
)
from durable_harness.recovery.decide import RecoveryPlan
from durable_harness.storage.base import Durability, SessionStore, Store
from durable_harness.tools.processes import this_host

__all__ = [
    "kill_call_group",
    "kill_stored_leftovers",
    "open_writable",
    "plan_sees_live_group",
]


def plan_sees_live_group(plan: RecoveryPlan) -> bool:
    """Whether ``plan`` reports a process group alive on this machine (``alive is True``;
    another machine's group is ``alive: None``, unknown)."""
    return any(
        (c.process or {}).get("alive") is True for lane in plan.lanes for c in lane.tool_calls
    )


def kill_stored_leftovers(
    store: Store, session_id: str, mode: Durability, by: KilledBy = "reconcile"
) -> int:
    """Take ``session_id``'s writer lease, kill its open runs' live groups on this machine and
    record each kill (:func:`~durable_harness.harness.groups.kill_and_record`); release the
    lease. Returns how many groups were killed; 0 when another process holds the lease (a
    live generation: its groups are its own, not leftovers).

    Raises:
        ToolProcessRunning: a group outlived SIGKILL (the kills before it are recorded).
        StorageError: the session could not be opened or written.
    """
    try:
        session = store.open_session(session_id, write=True, durability=mode)
    except LeaseHeld:
        return 0
    with session:
        return len(kill_and_record(session, by))


def kill_call_group(session: SessionStore, tool_call_id: str) -> dict[str, object]:
    """The operator's kill: SIGKILL the live recorded group of the unsettled call
    ``tool_call_id`` of ``session`` (open for writing: a live generation's store, or one
    opened under the lease) and record it (``tool_process_killed``, ``by: "operator"``).
    Returns ``{"tool_call_id", "pgid", "killed"}``; ``killed`` is False when the group had
    already ended (nothing is written then).

    Raises:
        InvalidRequest: no unsettled call of an open run has this id, or it has no group
            recorded on this machine (``details['host']`` names the machine when it was
            recorded on another: kill it there).
        ToolProcessRunning: the group outlived SIGKILL.
    """
    calls = [c for c in open_calls(session) if c.tool_call_id == tool_call_id]
    call = next((c for c in calls if c.status != "completed"), None)
    if call is None:
        raise InvalidRequest(
            f"session {session.session_id} has no unsettled tool call {tool_call_id!r} in an "
            "open run (see its plan)",
            session_id=session.session_id,
            tool_call_id=tool_call_id,
        )
    host = (call.process or {}).get("host", this_host())
    if host != this_host():
        raise InvalidRequest(
            f"tool call {tool_call_id} of session {session.session_id} runs on host {host} "
            f"(process group {(call.process or {}).get('pgid')}): kill it there",
            session_id=session.session_id,
            tool_call_id=tool_call_id,
            host=host,
        )
    group = recorded_group(call)
    if group is None:
        raise InvalidRequest(
            f"tool call {tool_call_id} of session {session.session_id} has no process group "
            "recorded (or it is known dead)",
            session_id=session.session_id,
            tool_call_id=tool_call_id,
        )
    killed = kill_and_record(session, "operator", tool_call_id=tool_call_id)
    return {"tool_call_id": tool_call_id, "pgid": group[0], "killed": bool(killed)}


def open_writable(store: Store, session_id: str, mode: Durability) -> SessionStore:
    """Open a session no generation of this process runs for writing (its lease taken): to
    resume it, close it, or kill one of its calls' groups.

    Raises:
        SessionLive: another live process holds its lease (act through that host).
    """
    try:
        return store.open_session(session_id, write=True, durability=mode)
    except LeaseHeld as exc:
        raise SessionLive(exc.message, session_id=session_id) from exc
