"""The one rule of forgetting a session for good (``design/host.md``, "Forget and prune"): the
host's ``forget`` verb, ``DELETE /sessions/{id}``, and the CLI's ``forget`` and ``prune`` all
refuse through :func:`forget_refusal` and delete through :func:`forget_stored`."""

from __future__ import annotations

from durable_harness.errors import (
    DurableHarnessError,
    IllegalTransition,
    LeaseHeld,
    SessionLive,
    ToolProcessRunning,
)
from durable_harness.harness.groups import live_groups, open_calls
from durable_harness.host.record import read_record
from durable_harness.storage.base import Store


def forget_refusal(session_id: str, state: str, pgids: list[int]) -> DurableHarnessError | None:
    """Why a session in lifecycle ``state`` whose unsettled calls' live process groups are
    ``pgids`` cannot be forgotten, or ``None`` when it can: only a ``closed`` session (never a
    live, waiting or failed one: close it first) with no recorded group still running.

    Returns:
        :class:`~durable_harness.errors.IllegalTransition` (not closed) or
        :class:`~durable_harness.errors.ToolProcessRunning` (a group still runs), unraised.
    """
    if state != "closed":
        return IllegalTransition(
            f"session {session_id} is {state}: only a closed session can be forgotten; "
            "close it first",
            session_id=session_id,
            **{"from": state, "to": "forgotten"},
        )
    if pgids:
        return ToolProcessRunning(
            f"session {session_id} is closed but the process groups {pgids} of its "
            "unsettled tool calls still run; close it again (which kills them) before "
            "forgetting it",
            session_id=session_id,
            pgids=pgids,
        )
    return None


def stored_refusal(store: Store, session_id: str) -> DurableHarnessError | None:
    """:func:`forget_refusal` for a session of ``store`` as the store has it (its lifecycle
    state as a host reads it, a live lease holder counting as live), read without a lease.

    Raises:
        SessionNotFound, StorageError: the session cannot be read.
    """
    with store.open_session(session_id, write=False) as ss:
        holder = ss.lease_holder()
        if holder is not None:
            return SessionLive(
                f"session {session_id} is live in another process (pid {holder.get('pid')} "
                f"on {holder.get('host')}); close it there first",
                session_id=session_id,
                holder_pid=holder.get("pid"),
            )
        state = read_record(ss, store.spec, owner_alive=False).state
        pgids = [(c.process or {}).get("pgid", 0) for c in live_groups(open_calls(ss))]
    return forget_refusal(session_id, state, pgids)


def forget_stored(store: Store, session_id: str) -> None:
    """Delete a session the rule allows forgetting (the caller checked it), under its writer
    lease: a process that took it since is :class:`~durable_harness.errors.SessionLive`.

    Raises:
        SessionLive: a live process holds the session now.
        SessionNotFound, StorageError: as :meth:`Store.delete_session` raises them.
    """
    try:
        store.delete_session(session_id)
    except LeaseHeld as exc:
        raise SessionLive(exc.message, session_id=session_id) from exc
