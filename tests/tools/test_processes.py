"""The one process-group liveness rule (:func:`group_alive`): zombies do not count, a group
reusing a recorded number is not the recorded one, and :func:`kill_group` follows the rule."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from durable_harness.tools.processes import group_alive, kill_group, process_start_time

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def wait_for(condition: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def state(pid: int) -> str | None:
    """The state letter of ``pid`` from ``/proc/<pid>/stat``, or ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


def group_exists(pgid: int) -> bool:
    """What the kernel says, zombies included: ``killpg(pgid, 0)`` succeeds."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Children started by a test; any left are killed and reaped at the end."""
    children: list[subprocess.Popen[bytes]] = []
    yield children
    for child in children:
        if child.poll() is None:
            try:
                os.killpg(child.pid, 9)
            except ProcessLookupError:
                pass
        child.wait()


def test_unreaped_zombie_leader_is_not_alive_and_reaped_is_gone(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    child = subprocess.Popen(["true"], start_new_session=True)
    spawned.append(child)
    start = process_start_time(child.pid)
    assert start is not None
    # Not reaped: the leader stays a zombie and the kernel still reports the group.
    wait_for(lambda: state(child.pid) == "Z", "the leader to become a zombie")
    assert group_exists(child.pid)
    assert group_alive(child.pid) is False
    assert group_alive(child.pid, start) is False
    assert kill_group(child.pid, start) is False  # nothing live to kill
    # Reaped: the group is gone for the kernel and for the rule alike.
    child.wait()
    assert not group_exists(child.pid)
    assert group_alive(child.pid, start) is False


def test_zombie_leader_with_a_running_member_is_alive_until_killed(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    child = subprocess.Popen(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    spawned.append(child)
    assert child.stdout is not None
    member = int(child.stdout.readline())
    child.stdout.close()
    wait_for(lambda: state(child.pid) == "Z", "the leader to become a zombie")
    start = process_start_time(child.pid)
    assert group_alive(child.pid, start) is True  # the background sleep still runs
    assert kill_group(child.pid, start) is True
    wait_for(lambda: state(member) in (None, "Z"), "the member to die")
    assert group_alive(child.pid, start) is False


def test_a_group_reusing_the_number_is_not_the_recorded_one(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    spawned.append(child)
    start = process_start_time(child.pid)
    assert start is not None
    assert group_alive(child.pid, start) is True
    assert group_alive(child.pid) is True
    assert group_alive(child.pid, start + 1) is False
    assert kill_group(child.pid, start + 1) is False
    assert child.poll() is None  # the unrelated group was left alone
    assert kill_group(child.pid, start) is True
    assert child.wait() == -9
