"""Group commit across the sessions of one SQLite store: concurrent ``commit_async`` calls and
barriers of different ``batch`` sessions share one transaction and one WAL sync; each call is
durable when it returns; a failing call (a duplicate id, a stale lease) fails alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.crashtest import powercut
from durable_harness.errors import IdConflict, SessionClosed, StaleGeneration
from durable_harness.storage import EntryOp, RecordOp, handoff, open_store, timing
from durable_harness.storage.barrier_trace import TRACE_ENV

from .util import ent, ids, outcomes, rec, sqlite_store

pytestmark = [pytest.mark.timeout(120)]

SESSIONS = 24
ROUNDS = 5


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fsyncs() -> Any:
    """The WAL syncs reported to :mod:`durable_harness.storage.timing` while the test runs."""
    seen: list[float] = []
    remove = timing.add_observer(lambda what, s: seen.append(s) if what == "fsync" else None)
    yield seen
    remove()


@pytest.mark.anyio
async def test_calls_of_many_sessions_share_transactions_and_syncs(
    tmp_path: Path, fsyncs: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The groups of the loop's own path. (A disk slow enough that its syncs average over
    ``INLINE_SYNC_S`` moves each group's sync to a worker thread, where a round was seen
    split between groups, 13 transactions for 5 rounds in one loaded run; that path is
    ``tests/storage/test_handoff.py``'s.)"""
    monkeypatch.setattr(handoff, "INLINE_SYNC_S", float("inf"))
    store = sqlite_store(tmp_path)
    sessions = [store.create_session("/p", durability="batch") for _ in range(SESSIONS)]
    before = (store.stats.transactions, store.stats.commits, len(fsyncs))

    async def writer(t: int) -> None:
        parent = None
        for i in range(ROUNDS):
            eid = f"s{t}-{i}"
            await sessions[t].commit_async(
                [EntryOp(ent(eid, parent), lane="main"), RecordOp(rec(f"r-{eid}"))]
            )
            parent = eid

    try:
        async with anyio.create_task_group() as tg:
            for t in range(SESSIONS):
                tg.start_soon(writer, t)
        calls = SESSIONS * ROUNDS
        transactions = store.stats.transactions - before[0]
        assert store.stats.commits - before[1] == calls
        # every session commits once per round, all in the round's group: one transaction and
        # one WAL sync per round, never one per call
        assert ROUNDS <= transactions <= 2 * ROUNDS, transactions
        assert ROUNDS <= len(fsyncs) - before[2] <= 2 * ROUNDS, len(fsyncs) - before[2]
        for t, s in enumerate(sessions):  # each reads its own writes at once
            assert s.lane("main").leaf_id == f"s{t}-{ROUNDS - 1}"
    finally:
        for s in sessions:
            s.close()
    again = open_store(store.spec)
    for t, s in enumerate(sessions):
        with again.open_session(s.session_id, write=False) as back:
            assert ids(back.iter_entries()) == [f"s{t}-{i}" for i in range(ROUNDS)]
            assert [r["seq"] for r in back.records()] == [2 * i + 2 for i in range(ROUNDS)]
            assert back.damage == []


@pytest.mark.anyio
async def test_barriers_of_many_sessions_share_one_sync(
    tmp_path: Path, fsyncs: list[float]
) -> None:
    """The harness's pattern: each session commits unwaited, then awaits its barrier; the
    barriers of all sessions are one WAL sync."""
    store = sqlite_store(tmp_path)
    sessions = [store.create_session("/p", durability="batch") for _ in range(SESSIONS)]
    try:
        for t, s in enumerate(sessions):
            s.commit([EntryOp(ent(f"e{t}"), lane="main")], wait=False)
        before = len(fsyncs)
        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(s.wait_durable_async)
        assert len(fsyncs) - before == 1
        for s in sessions:  # covered: no further sync
            await s.wait_durable_async()
            s.wait_durable()
        assert len(fsyncs) - before == 1
    finally:
        for s in sessions:
            s.close()


@pytest.mark.anyio
async def test_a_failing_call_fails_alone_in_a_group_of_many_sessions(tmp_path: Path) -> None:
    """One group: a duplicate id in session A, a writer of session B whose lease another
    store broke, good calls of A and C. Only the bad calls fail, in one transaction."""
    store = sqlite_store(tmp_path)
    a, b, c = (store.create_session("/p", durability="batch") for _ in range(3))
    a.commit([EntryOp(ent("taken"), lane="main")])
    b.commit([EntryOp(ent("b0"), lane="main")])
    thief = open_store(store.spec).open_session(b.session_id, break_lease=True)
    before = store.stats.transactions
    try:
        out = await outcomes(
            {
                "a-dup": (a, [EntryOp(ent("taken"), lane="side"), RecordOp(rec("a-x"))]),
                "a-ok": (a, [RecordOp(rec("a-r"))]),
                "b-stale": (b, [EntryOp(ent("b1", "b0"), lane="main")]),
                "c-ok": (c, [EntryOp(ent("c1"), lane="main"), RecordOp(rec("c-r"))]),
            }
        )
        assert isinstance(out["a-dup"], IdConflict)
        assert isinstance(out["b-stale"], StaleGeneration)
        assert isinstance(out["a-ok"], int) and isinstance(out["c-ok"], int)
        assert store.stats.transactions - before == 1  # rerun with savepoints, one COMMIT
    finally:
        for s in (a, b, c, thief):
            s.close()
    again = open_store(store.spec)
    with again.open_session(a.session_id, write=False) as back:
        assert ids(back.iter_entries()) == ["taken"] and ids(back.records()) == ["a-r"]
        assert back.damage == []
    with again.open_session(b.session_id, write=False) as back:
        assert ids(back.iter_entries()) == ["b0"]
    with again.open_session(c.session_id, write=False) as back:
        assert ids(back.iter_entries()) == ["c1"] and ids(back.records()) == ["c-r"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # FIFO start order: queued, then close
@pytest.mark.anyio
async def test_a_session_closed_while_its_call_waits_for_its_group(tmp_path: Path) -> None:
    """``close()`` commits the queued calls (an accepted call is never dropped), then the
    session refuses new ones."""
    store = sqlite_store(tmp_path)
    s = store.create_session("/p", durability="batch")
    out: dict[str, Any] = {}

    async def commit() -> None:
        out["seq"] = await s.commit_async([EntryOp(ent("queued"), lane="main")])

    async def close() -> None:
        s.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(commit)
        tg.start_soon(close)
    assert out["seq"] == 1
    with pytest.raises(SessionClosed):
        await s.commit_async([EntryOp(ent("late"), lane="main")])
    with pytest.raises(SessionClosed):
        s.commit([EntryOp(ent("late"), lane="main")])
    with open_store(store.spec).open_session(s.session_id, write=False) as back:
        assert ids(back.iter_entries()) == ["queued"]


def test_threads_of_many_sessions_share_groups(tmp_path: Path) -> None:
    """``commit()`` in ``batch`` mode from threads of different sessions, grouped as they
    overlap (how many share a group depends on scheduling): each call gets its own session's
    next seq, and every call is counted once."""
    import threading

    store = sqlite_store(tmp_path)
    sessions = [store.create_session("/p", durability="batch") for _ in range(8)]
    start = threading.Barrier(len(sessions))
    seqs: dict[int, list[int]] = {}

    def work(t: int) -> None:
        start.wait()
        seqs[t] = [sessions[t].commit([RecordOp(rec(f"t{t}-{i}"))]) for i in range(20)]

    workers = [threading.Thread(target=work, args=(t,)) for t in range(len(sessions))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    try:
        assert all(seqs[t] == list(range(1, 21)) for t in range(len(sessions)))
        assert store.stats.commits == 8 * 20
    finally:
        for s in sessions:
            s.close()


# -- durable when acknowledged: SIGKILL and a power cut ----------------------------------------

_CHILD = """
import sys, anyio
from durable_harness.storage import EntryOp, RecordOp, open_store

store = open_store(sys.argv[1])
sessions = [store.create_session("/w", durability="batch") for _ in range(int(sys.argv[2]))]
print("ready", flush=True)


async def writer(t, s):
    i, parent = 0, None
    while True:
        eid = f"{t}-{i}"
        entry = {"type": "custom", "customType": "t", "id": eid, "parentId": parent,
                 "timestamp": "2026-01-01T00:00:00.000Z"}
        record = {"type": "note", "id": "r" + eid, "lane": "main",
                  "timestamp": "2026-01-01T00:00:00.000Z"}
        await s.commit_async([EntryOp(entry, lane="main"), RecordOp(record)])
        print(s.session_id, eid, flush=True)  # the acknowledgement
        i, parent = i + 1, eid


async def main():
    async with anyio.create_task_group() as tg:
        for t, s in enumerate(sessions):
            tg.start_soon(writer, t, s)


anyio.run(main)
"""


def test_every_acknowledged_call_survives_sigkill_and_power_cut(tmp_path: Path) -> None:
    """A child commits from 16 sessions of one store in groups and prints each call's
    acknowledgement after ``commit_async`` returns; it is SIGKILLed mid-stream, then its WAL is
    cut back to what its last WAL sync covered (a power cut). Every acknowledged call is
    there, whole."""
    db = tmp_path / "s.db"
    trace = tmp_path / "trace"
    env = {**os.environ, TRACE_ENV: str(trace)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, f"sqlite:{db}", "16"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    acked: dict[str, list[str]] = {}
    count = 0
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while count < 400 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the child stopped before it was killed"
            sid, eid = line.split()
            acked.setdefault(sid, []).append(eid)
            count += 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert count >= 400
    powercut.cut_sqlite(db, str(trace))
    store = open_store(f"sqlite:{db}")
    for sid, eids in acked.items():
        with store.open_session(sid, write=False) as back:
            stored = ids(back.iter_entries())
            assert stored[: len(eids)] == eids  # every acknowledged call, in order
            assert {f"r{e}" for e in eids} <= set(ids(back.records()))  # and whole
            assert [d for d in back.damage if d["kind"] != "truncated"] == []
