"""The process groups recorded for a session's unsettled tool calls: which are alive, and
killing them before anything settles, re-runs or forgets the call.

A ``bash`` call's group is recorded in a ``tool_process`` record (pgid and the leader's start
time, :mod:`durable_harness.tools.processes`); the fold keeps it on the call while the call is
in doubt. A group left running by a harness that died may still land its effect, so one rule,
here, for every place that ends the life of such a call (``design/recovery.md``, "Process
groups left running"): the harness before it settles or re-runs a call
(:meth:`~durable_harness.harness.tool_calls.ToolCalls.stop_leftover`), the host when it closes,
reconciles or refuses to forget a session (``design/host.md``), and recovery's snapshot, which
only reports whether the group is alive (``recover`` never kills).

Killing checks the leader's start time (a reused pgid is never signalled) and waits, bounded,
until no member runs. Every kill of a dead generation's group is recorded
(``tool_process_killed``, with who killed it), so the plan stops reporting it. A group recorded
on another machine is never signalled from here (its pgid names nothing here): it is reported
(:func:`elsewhere`) and a retry of its call is refused unless forced
(``durable_harness.recovery.remote``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal

from durable_harness import logs
from durable_harness.errors import ToolProcessRunning
from durable_harness.harness.records import call_record
from durable_harness.harness.state import RunState, ToolCallState, open_run
from durable_harness.storage.base import RecordOp, SessionStore
from durable_harness.tools.processes import group_alive, kill_group, this_host

log = logging.getLogger("durable_harness.harness.groups")

KilledBy = Literal["reconcile", "claim", "resume", "close", "operator"]

KILL_WAIT = 5.0
"""Seconds to wait, after SIGKILL, for a recorded group to have no running member."""


def recorded_group(call: ToolCallState) -> tuple[int, int | None] | None:
    """``(pgid, leader start time or None)`` of the group recorded for ``call``, or ``None``
    when none is recorded (or the record is unusable: a pgid of 0 or 1 would name our own
    group or init's, so it is never taken)."""
    process = call.process or {}
    pgid = process.get("pgid")
    if type(pgid) is not int or pgid <= 1:
        return None
    if process.get("host", this_host()) != this_host():
        return None  # another machine's group: never signalled from here
    start = process.get("startTime")
    return pgid, start if type(start) is int else None


def elsewhere(call: ToolCallState) -> dict[str, Any] | None:
    """``{"host", "pid"}`` of the group recorded for ``call`` when it was recorded on another
    machine (so it may still run there, and nothing here can tell or kill it), else ``None``.
    ``pid`` is the group leader's pid (the pgid)."""
    process = call.process or {}
    host = process.get("host")
    if call.status == "completed" or not isinstance(host, str) or host == this_host():
        return None
    return {"host": host, "pid": process.get("pgid")}


def killed_record(lane: str, run_id: str, call: ToolCallState, by: KilledBy) -> dict[str, Any]:
    """The ``tool_process_killed`` record of ``call``'s recorded group (``by``: who)."""
    return call_record(
        "tool_process_killed",
        lane,
        run_id,
        call,
        pgid=(call.process or {}).get("pgid"),
        host=this_host(),
        by=by,
    )


def _unsettled(calls: Iterable[ToolCallState]) -> list[tuple[ToolCallState, int, int | None]]:
    out = []
    for call in calls:
        group = recorded_group(call)
        if call.status != "completed" and group is not None:
            out.append((call, *group))
    return out


def live_groups(calls: Iterable[ToolCallState]) -> list[ToolCallState]:
    """The unsettled calls among ``calls`` whose recorded group is alive
    (:func:`~durable_harness.tools.processes.group_alive`, with the start-time check)."""
    return [call for call, pgid, start in _unsettled(calls) if group_alive(pgid, start)]


def kill_groups(
    calls: Iterable[ToolCallState], session_id: str, *, wait: float = KILL_WAIT
) -> list[ToolCallState]:
    """SIGKILL the live recorded group of every unsettled call among ``calls`` and wait up to
    ``wait`` seconds for each to have no running member. Returns the calls whose group was
    killed. Only call this where the group's harness is known dead or is this process (the
    caller holds the session's writer lease).

    Raises:
        ToolProcessRunning: a group still has a running member after ``wait`` seconds (a
            process stuck in the kernel): nothing about its call may be settled yet.
    """
    killed: list[ToolCallState] = []
    for call, pgid, start in _unsettled(calls):
        if kill_group(pgid, start, grace=wait):
            killed.append(call)
            logs.event(
                log,
                "leftover_killed",
                "session %s: killed process group %s left by tool call %s",
                session_id,
                pgid,
                call.tool_call_id,
                announce=True,
                session_id=session_id,
                tool_call_id=call.tool_call_id,
                tool=call.tool_name,
                pgid=pgid,
            )
        if group_alive(pgid, start):
            raise ToolProcessRunning(
                f"session {session_id}: process group {pgid} of tool call {call.tool_call_id} "
                f"is still running {wait:g} s after SIGKILL",
                session_id=session_id,
                pgids=[pgid],
            )
    return killed


def open_runs(store: SessionStore) -> list[RunState]:
    """Every lane's open run, folded from ``store`` (read-only or writable).

    Raises:
        StorageError: the session cannot be read.
    """
    return [run for lane in store.lanes().values() if (run := open_run(store, lane))]


def open_calls(store: SessionStore) -> list[ToolCallState]:
    """The tool calls of every lane's open run, folded from ``store`` (read-only or
    writable), each with its recorded process group if any.

    Raises:
        StorageError: the session cannot be read.
    """
    return [call for run in open_runs(store) for call in run.tool_calls]


def kill_and_record(
    store: SessionStore,
    by: KilledBy,
    *,
    tool_call_id: str | None = None,
    write: Callable[..., None] | None = None,
) -> list[ToolCallState]:
    """Kill the live groups (on this machine) of the open runs' unsettled calls of ``store``
    (open for writing, its lease held: the generation that started them is gone, or is this
    one) or only ``tool_call_id``'s, and commit one ``tool_process_killed`` record per group
    killed, in one commit: through ``write(*records)`` when given (a live session's
    :meth:`Harness.record <durable_harness.harness.harness.Harness.record>`, its one writer),
    else on ``store``. Returns the calls whose group was killed.

    Raises:
        ToolProcessRunning: a group outlived SIGKILL by ``KILL_WAIT`` s (what was killed
            before it is still recorded).
        StorageError: the records could not be written.
    """
    killed: list[tuple[RunState, ToolCallState]] = []
    try:
        for run in open_runs(store):
            calls = [
                c for c in run.tool_calls if tool_call_id is None or c.tool_call_id == tool_call_id
            ]
            for call in kill_groups(calls, store.session_id):
                killed.append((run, call))
    finally:
        if killed:
            records = [killed_record(r.lane, r.run_id, c, by) for r, c in killed]
            if write is not None:
                write(*records)
            else:
                store.commit([RecordOp(r) for r in records])
    return [c for _, c in killed]
