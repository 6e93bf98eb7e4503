"""Process groups a tool started: identifying them across a crash, and when they are alive.

A ``bash`` command's group outlives a SIGKILLed harness and may still finish its effect, so
the harness records each group (``tool_process``: pgid and the leader's start time,
``/proc/<pid>/stat`` field 22, clock ticks since boot, ``proc(5)``): recovery can then tell the
group a dead harness left from an unrelated one reusing the number. One liveness rule serves
the ``bash`` tool, the harness and recovery: :func:`group_alive`. A zombie does not count: it
runs no code, and its reaping may never come (an orphan waits for an init a container may not
run).
"""

from __future__ import annotations

import os
import signal
import socket
import time

_PROC = "/proc"


def this_host() -> str:
    """This machine's name (``socket.gethostname()``), recorded with every group
    (``tool_process.host``): a pgid means something only on the machine that recorded it."""
    return socket.gethostname()


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after ``comm`` (``fields[0]`` is field 3, the
    state), or ``None`` when there is no such process or no ``/proc``."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    return stat[stat.rfind(b")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or ``None`` when unknown (no /proc,
    or no such process)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid`` (``0`` only checks it exists); return False when
    the group no longer exists or names a group we may not signal (not ours: treated as gone)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _has_running_member(pgid: int) -> bool:
    """True when a process of group ``pgid`` is not a zombie; without ``/proc`` every member
    counts (the caller has checked that the group has one)."""
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return True
    wanted = str(pgid).encode()
    for name in entries:
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None and len(fields) > 2 and fields[2] == wanted and fields[0] != b"Z":
            return True
    return False


def group_alive(pgid: int, start_time: int | None = None) -> bool:
    """True while process group ``pgid`` has a member that is not a zombie and is the group
    that was recorded.

    Args:
        pgid: the process-group id (the leader's pid).
        start_time: the leader's recorded start time (clock ticks since boot, from
            :func:`process_start_time`), or ``None`` to skip the identity check. With it, a
            group whose leader has another start time is an unrelated one reusing the number
            (not alive); a group whose leader is gone is still the recorded one (a group id is
            not reused while the group has members).

    A group whose every member is a zombie is not alive (see the module docstring).
    """
    if not signal_group(pgid, 0):
        return False
    if start_time is not None:
        leader_start = process_start_time(pgid)
        if leader_start is not None and leader_start != start_time:
            return False
    return _has_running_member(pgid)


def kill_group(pgid: int, start_time: int | None, grace: float = 0.5) -> bool:
    """SIGKILL the recorded group if it is alive (:func:`group_alive`); wait up to ``grace``
    seconds for its members to be gone or zombies. Returns True when a live group was
    killed."""
    if not group_alive(pgid, start_time):
        return False
    if not signal_group(pgid, signal.SIGKILL):
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(pgid):
        time.sleep(0.02)
    return True
