"""Process groups a tool started: identifying them across a crash and stopping them.

A ``bash`` tool runs in its own process group, so SIGKILL of the harness does not stop it: the
group may go on and finish its effect after the crash. The harness records each group
(``tool_process``: pgid and the leader's start time, from ``/proc/<pid>/stat`` field 22, in
clock ticks since boot) so that recovery can tell a group the dead harness left running from an
unrelated one that reuses the number, and kill it before deciding anything about the call.
"""

from __future__ import annotations

import os
import signal
import time


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or ``None`` when unknown (no /proc,
    or no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line; fields[0] is field 3
    except (IndexError, ValueError):
        return None


def group_alive(pgid: int, start_time: int | None) -> bool:
    """True when process group ``pgid`` still has members and is the recorded one: its leader
    has the recorded start time, or the leader is gone (a group id is not reused while the
    group has members)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    leader_start = process_start_time(pgid)
    return leader_start is None or start_time is None or leader_start == start_time


def kill_group(pgid: int, start_time: int | None, grace: float = 0.5) -> bool:
    """SIGKILL the recorded group if it is still alive; wait up to ``grace`` seconds for it to
    go. Returns True when a live group was killed."""
    if not group_alive(pgid, start_time):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    return True
