"""The sync hand-off of a tasks' group (``storage/handoff.py``): while syncs are slow, the sync a
group asks for runs in a worker thread and the event loop goes on running other tasks; every call
of the group returns only once that sync covered it, and a failed sync fails them all. On SQLite
(``batch``), with syncs forced off the loop's thread: each barrier returns durable, and the
syncs run in another thread."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.storage import EntryOp, SqliteStore, handoff, open_store
from durable_harness.storage.handoff import PendingCommit, SyncHandoff, TaskQueue, settling

from .util import ent, ids

pytestmark = [pytest.mark.timeout(120)]

SYNC_S = 0.05  # a slow sync (the GIL released, as in fdatasync)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class FakeDisk:
    """Tickets written by groups, synced by a slow ``sync`` that records its thread."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.written = 0
        self.handoff = SyncHandoff()
        self.handoff.avg_s = 1.0  # slow: a group defers its sync
        self.threads: list[int] = []
        self.fail = fail
        self.syncs = 0
        self.groups: list[int] = []  # each group's size

    def sync(self) -> int:
        covered = self.written
        self.threads.append(threading.get_ident())
        time.sleep(SYNC_S)
        self.syncs += 1
        if self.fail is not None:
            raise self.fail
        return covered

    def run(self, batch: list[PendingCommit]) -> None:
        """A group: one ticket per call, then one sync to the last."""
        self.groups.append(len(batch))
        with settling(batch):
            for item in batch:
                self.written += 1
                item.seq = self.written
            self.handoff.sync_to(self.written, self.sync)


@pytest.mark.anyio
async def test_a_slow_sync_runs_off_the_loop_and_every_call_returns_durable() -> None:
    disk, queue = FakeDisk(), TaskQueue[PendingCommit]()
    returned: dict[int, int] = {}  # seq -> synced when the call returned
    ticks = 0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            await anyio.sleep(0.001)
            ticks += 1

    async def call() -> None:
        seq = await queue.commit(PendingCommit([{"op": "x"}]), disk.run)
        returned[seq] = disk.handoff.synced

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with anyio.create_task_group() as calls:
            for _ in range(10):
                calls.start_soon(call)
        done.set()
    assert sorted(returned) == list(range(1, 11))
    assert all(synced >= seq for seq, synced in returned.items())  # durable when returned
    assert disk.syncs >= 1 and threading.get_ident() not in disk.threads
    assert ticks >= 5  # the loop ran the ticker while the disk synced


@pytest.mark.anyio
async def test_a_barrier_starts_its_sync_at_once_while_syncs_run_in_a_thread() -> None:
    """Once a group deferred its sync, a barrier (no ops) finding no sync running leads without
    yielding; the barriers arriving meanwhile share the next sync."""
    disk, queue = FakeDisk(), TaskQueue[PendingCommit]()
    await queue.commit(PendingCommit([{"op": "x"}]), disk.run)  # the queue learns syncs are slow
    seqs: list[int] = []

    async def barrier() -> None:
        seqs.append(await queue.commit(PendingCommit([]), disk.run))

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(barrier)
    assert sorted(seqs) == list(range(2, 8))
    assert disk.handoff.synced >= 7
    assert disk.groups == [1, 1, 5]  # the first barrier alone, at once; the five after it


@pytest.mark.anyio
async def test_a_failed_deferred_sync_fails_every_call_of_its_group() -> None:
    disk, queue = FakeDisk(fail=OSError(5, "EIO")), TaskQueue[PendingCommit]()
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await queue.commit(PendingCommit([{"op": "x"}]), disk.run)
        except OSError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(call)
    assert len(errors) == 4
    assert disk.handoff.synced == 0  # not known durable


@pytest.mark.anyio
async def test_a_call_taken_by_a_group_is_not_abandoned_when_cancelled() -> None:
    """Cancelled while its group's sync runs, the call still returns its seq once the sync is
    over (its commit is made: reporting it cancelled would hide it)."""
    disk, queue = FakeDisk(), TaskQueue[PendingCommit]()
    got: list[tuple[int, int]] = []
    syncing = threading.Event()
    real_sync = disk.sync

    def sync() -> int:
        syncing.set()
        return real_sync()

    disk.sync = sync  # type: ignore[method-assign]

    async def call() -> None:
        seq = await queue.commit(PendingCommit([{"op": "x"}]), disk.run)
        got.append((seq, disk.handoff.synced))

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(call)
        while not syncing.is_set():  # the cancel lands while the group's sync runs, whatever
            await anyio.sleep(0.001)  # the machine's load (a timed cancel once came first)
        tg.cancel_scope.cancel()
    assert disk.groups == [3]
    assert sorted(s for s, _ in got) == [1, 2, 3]
    assert all(synced >= seq for seq, synced in got)


@pytest.mark.anyio
async def test_fast_syncs_stay_on_the_loops_thread() -> None:
    disk, queue = FakeDisk(), TaskQueue[PendingCommit]()
    disk.handoff.avg_s = 0.0
    await queue.commit(PendingCommit([{"op": "x"}]), disk.run)
    assert disk.threads == [threading.get_ident()]


@pytest.mark.anyio
async def test_sqlite_barriers_with_syncs_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness's pattern on SQLite ``batch`` sessions, every group's sync deferred: each
    barrier returns with the session's commits durable, the WAL synced in other threads."""
    monkeypatch.setattr(handoff, "INLINE_SYNC_S", 0.0)
    threads: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        threads.append(threading.get_ident())
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    store = open_store(f"sqlite:{tmp_path / 's.db'}")
    assert isinstance(store, SqliteStore)
    sessions: list[Any] = [store.create_session("/p", durability="batch") for _ in range(8)]
    durable: list[bool] = []

    async def session_run(t: int) -> None:
        s, parent = sessions[t], None
        for i in range(4):
            eid = f"s{t}-{i}"
            s.commit([EntryOp(ent(eid, parent), lane="main")], wait=False)
            parent = eid
            await s.wait_durable_async()
            durable.append(s._shared.synced >= s._ticket)

    try:
        async with anyio.create_task_group() as tg:
            for t in range(len(sessions)):
                tg.start_soon(session_run, t)
    finally:
        for s in sessions:
            s.close()
    assert durable == [True] * 32
    assert set(threads) - {threading.get_ident()}  # synced off the loop
    again = open_store(store.spec)
    for t, s in enumerate(sessions):
        with again.open_session(s.session_id, write=False) as back:
            assert ids(back.iter_entries()) == [f"s{t}-{i}" for i in range(4)]
