"""The single-writer lease: a live second writer is refused (in this process or another), a dead
holder's lease is taken over, and a broken lease fences the old writer out (StaleGeneration)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from durable_harness.errors import LeaseHeld, StaleGeneration
from durable_harness.storage import EntryOp, RecordOp, Store

from .conftest import Reopen
from .util import ent, ids, rec

# Opens SPEC's session SID for writing; exit 3 with "lease_held: ..." on stderr when refused.
TRY_WRITE = """
import sys
from durable_harness.errors import LeaseHeld
from durable_harness.storage import open_store
try:
    s = open_store(sys.argv[1]).open_session(sys.argv[2], write=True)
except LeaseHeld as exc:
    print(f"{exc.code}: {exc}", file=sys.stderr)
    sys.exit(3)
print(f"opened generation={s.generation}", flush=True)
s.close()
"""

# Opens for writing, commits one entry, says "ready GEN", then sleeps holding the lease.
HOLD = """
import sys, time
from durable_harness.storage import EntryOp, open_store
s = open_store(sys.argv[1]).open_session(sys.argv[2], write=True)
s.commit([EntryOp({"type": "custom", "customType": "t", "id": "from-child", "parentId": None},
                  lane="main")])
print(f"ready {s.generation}", flush=True)
time.sleep(120)
"""


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=25
    )


def test_second_writer_in_process_is_refused(store: Store) -> None:
    a = store.create_session("/p")
    a.commit([EntryOp(ent("e1"), lane="main")])
    with pytest.raises(LeaseHeld) as info:
        store.open_session(a.session_id, write=True)
    assert info.value.code == "lease_held"
    assert info.value.details["holder_pid"] == os.getpid()
    assert str(os.getpid()) in str(info.value)

    ro = store.open_session(a.session_id, write=False)
    try:
        assert ids(ro.iter_entries()) == ["e1"]
        holder = ro.lease_holder()
        assert holder is not None and holder["pid"] == os.getpid()
    finally:
        ro.close()

    gen_a = a.generation
    a.commit([EntryOp(ent("e2", "e1"), lane="main")])  # the refused open did not disturb A
    a.close()
    b = store.open_session(a.session_id, write=True)
    try:
        assert b.generation > gen_a
        assert ids(b.iter_entries()) == ["e1", "e2"]
        b.commit([RecordOp(rec("r1"))])
    finally:
        b.close()


@pytest.mark.timeout(30)
def test_second_process_is_refused_while_held(store: Store) -> None:
    a = store.create_session("/p")
    sid = a.session_id
    refused = _run(TRY_WRITE, store.spec, sid)
    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.startswith("lease_held: ")
    assert f"pid {os.getpid()}" in refused.stderr
    assert "opened" not in refused.stdout
    gen_a = a.generation
    a.close()

    opened = _run(TRY_WRITE, store.spec, sid)
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.strip() == f"opened generation={gen_a + 1}"


@pytest.mark.crash
@pytest.mark.timeout(30)
def test_lease_of_sigkilled_process_is_taken_over(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    sid = s.session_id
    s.close()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, store.spec, sid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("ready "), child.stderr.read() if child.stderr else line
        child_gen = int(line.split()[1])
        with pytest.raises(LeaseHeld) as info:
            store.open_session(sid, write=True)
        assert info.value.details["holder_pid"] == child.pid
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL

    ro = store.open_session(sid, write=False)
    try:
        assert ro.lease_holder() is None  # nobody alive holds it
    finally:
        ro.close()
    s = store.open_session(sid, write=True)
    try:
        assert s.generation > child_gen
        assert ids(s.iter_entries()) == ["from-child"]
        s.commit([EntryOp(ent("after", "from-child"), lane="main")])
        s = reopen(store, s, write=False)
        assert ids(s.iter_entries()) == ["from-child", "after"]
    finally:
        s.close()


def test_stale_writer_is_fenced_after_break_lease(store: Store, reopen: Reopen) -> None:
    a = store.create_session("/p")
    a.commit([EntryOp(ent("e1"), lane="main")])
    b = store.open_session(a.session_id, write=True, break_lease=True)
    try:
        assert b.generation > a.generation
        with pytest.raises(StaleGeneration) as info:
            a.commit([EntryOp(ent("late", "e1"), lane="main"), RecordOp(rec("late-r"))])
        assert info.value.code == "stale_generation"
        assert b.get_entry("late") is None
        b.commit([EntryOp(ent("e2", "e1"), lane="main")])
        with pytest.raises(StaleGeneration):  # still fenced after the new writer's commit
            a.commit([RecordOp(rec("late-r2"))])
        a.close()
        b = reopen(store, b, write=False)
        assert ids(b.iter_entries()) == ["e1", "e2"]
        assert b.records() == []
        assert b.lanes()["main"].leaf_id == "e2"
    finally:
        a.close()
        b.close()


def test_a_removed_lock_file_fences_its_writer(tmp_path: os.PathLike[str]) -> None:
    """Deleting the JSONL lock file while a writer holds it lets a second writer in; the
    first writer's next append is refused instead of interleaving."""
    from durable_harness.storage import open_store

    store = open_store(f"jsonl:{tmp_path}")
    first = store.create_session("/w")
    first.commit([EntryOp(ent("e0", None), lane="main")])
    os.unlink(first.location + ".lock")
    second = store.open_session(first.session_id)  # the flock is on a new file now
    with pytest.raises(StaleGeneration):
        first.commit([EntryOp(ent("e1", "e0"), lane="main")])
    second.commit([EntryOp(ent("e1", "e0"), lane="main")])
    second.close()
    first.close()
    reopened = store.open_session(first.session_id, write=False)
    assert ids(reopened.iter_entries()) == ["e0", "e1"] and reopened.damage == []
    reopened.close()


def test_a_reset_lock_file_never_reuses_a_generation(tmp_path: os.PathLike[str]) -> None:
    from durable_harness.storage import open_store

    store = open_store(f"jsonl:{tmp_path}")
    s = store.create_session("/w")
    sid, path = s.session_id, s.location
    s.close()
    for i in range(3):
        s = store.open_session(sid)
        s.commit([RecordOp(rec(f"r{i}"))])
        s.close()
    used = s.generation
    os.unlink(path + ".lock")
    s = store.open_session(sid)
    assert s.generation > used
    s.commit([RecordOp(rec("r9"))])
    s.close()
    reopened = store.open_session(sid, write=False)
    assert reopened.damage == []  # no stale_generation on the new writer's lines
    reopened.close()


def _stale_check_passed(session: object) -> None:
    """Make ``session``'s lease checks pass, as a check that ran just before another writer
    took over would: the window between a writer's check and its write or trim."""
    session.file._lease.check = lambda: None  # type: ignore[attr-defined]


def test_a_write_slipping_past_the_fence_never_lands_on_the_new_writers_lines(
    tmp_path: os.PathLike[str],
) -> None:
    from durable_harness.storage import open_store

    store = open_store(f"jsonl:{tmp_path}")
    a = store.create_session("/w", durability="sync")
    a.commit([EntryOp(ent("e1", None), lane="main")])
    b = store.open_session(a.session_id, break_lease=True)
    b.commit([EntryOp(ent("e2", "e1"), lane="main")])
    _stale_check_passed(a)
    a.commit([EntryOp(ent("late", "e1"), lane="main"), RecordOp(rec("late-r"))])
    a.close()  # and its close, past the fence too, must not cut b's lines
    b.commit([EntryOp(ent("e3", "e2"), lane="main")])
    b.close()
    reopened = store.open_session(a.session_id, write=False)
    assert ids(reopened.iter_entries()) == ["e1", "e2", "e3"]
    assert reopened.records() == [] and reopened.damage == []
    reopened.close()


def test_a_close_slipping_past_the_fence_never_cuts_the_new_writers_lines(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old writer's trim checks the lease and its padding, then truncates: a new writer's
    commit landing in between (forced here) must survive."""
    from durable_harness.storage import open_store

    store = open_store(f"jsonl:{tmp_path}")
    a = store.create_session("/w", durability="sync")
    a.commit([EntryOp(ent("e1", None), lane="main")])
    os.unlink(a.location + ".lock")  # the other way in for a second writer
    b = store.open_session(a.session_id)
    _stale_check_passed(a)
    real_truncate = os.ftruncate

    def truncate_after_b_commits(fd: int, length: int) -> None:
        b.commit([EntryOp(ent("e2", "e1"), lane="main")])
        real_truncate(fd, length)

    monkeypatch.setattr(os, "ftruncate", truncate_after_b_commits)
    a.close()
    monkeypatch.setattr(os, "ftruncate", real_truncate)
    assert b.get_entry("e2") is not None  # b did commit while a was closing
    b.close()
    reopened = store.open_session(a.session_id, write=False)
    assert ids(reopened.iter_entries()) == ["e1", "e2"] and reopened.damage == []
    reopened.close()
