"""The host's part in process groups a dead generation left running: kill them (under the
writer lease) before a plan is offered, and the operator's kill of one call's group
(``design/host.md``, "What happens to a running tool's group").
"""

from __future__ import annotations

from collections.abc import Callable

from durable_harness.errors import InvalidRequest, LeaseHeld, SessionLive
from durable_harness.harness.groups import KilledBy, kill_and_record, open_calls, recorded_group
from durable_harness.recovery.decide import RecoveryPlan
from durable_harness.storage.base import Durability, SessionStore, Store
from durable_harness.tools.processes import this_host


def plan_sees_live_group(plan: RecoveryPlan) -> bool:
    """Whether ``plan`` says resume kills a leftover process group first
    (:attr:`~durable_harness.recovery.decide.ToolCallPlan.kills_group`: an open call's group
    alive on this machine; another machine's group is ``alive: None``, unknown)."""
    return any(c.kills_group for lane in plan.lanes for c in lane.tool_calls)


def kill_stored_leftovers(
    store: Store, session_id: str, mode: Durability, by: KilledBy = "reconcile"
) -> int:
    """Under ``session_id``'s writer lease, kill and record its open runs' live groups on this
    machine (:func:`~durable_harness.harness.groups.kill_and_record`). Returns how many were
    killed; 0 when another process holds the lease (its groups are its own).

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


def kill_call_group(
    session: SessionStore, tool_call_id: str, write: Callable[..., None] | None = None
) -> dict[str, object]:
    """The operator's kill: SIGKILL and record (``by: "operator"``) the live group of the
    unsettled call ``tool_call_id`` of ``session`` (open for writing; ``write``: a live
    session's harness writer, as :func:`~durable_harness.harness.groups.kill_and_record`). Returns
    ``{"tool_call_id", "pgid", "killed"}`` (``killed`` False: the group had ended).

    Raises:
        InvalidRequest: no such unsettled call, or no group of it recorded on this machine
            (``details['host']`` names the other machine).
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
    killed = kill_and_record(session, "operator", tool_call_id=tool_call_id, write=write)
    return {"tool_call_id": tool_call_id, "pgid": group[0], "killed": bool(killed)}


def open_writable(store: Store, session_id: str, mode: Durability) -> SessionStore:
    """Open a session no generation here runs for writing (``SessionLive``: another live
    process holds its lease)."""
    try:
        return store.open_session(session_id, write=True, durability=mode)
    except LeaseHeld as exc:
        raise SessionLive(exc.message, session_id=session_id) from exc
