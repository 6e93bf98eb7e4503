"""``commit_async`` in ``batch`` mode: concurrent tasks share one write and one fsync per group,
each call still commits alone (its own line or savepoint), and a failing call fails alone."""

from __future__ import annotations

import os
from typing import Any

import anyio
import pytest

from durable_harness.errors import IdConflict, InvalidOp, StaleGeneration, StorageError
from durable_harness.storage import EntryOp, RecordOp, Store

from .conftest import Reopen
from .util import ent, ids, rec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


TASKS = 16
PER_TASK = 6


async def _writers(s: Any, tasks: int = TASKS, per_task: int = PER_TASK) -> list[int]:
    """``tasks`` tasks each commit ``per_task`` entries on their own lane; returns every seq."""
    seqs: list[int] = []

    async def writer(t: int) -> None:
        parent = None
        for i in range(per_task):
            eid = f"t{t}-{i}"
            seqs.append(
                await s.commit_async(
                    [EntryOp(ent(eid, parent), lane=f"l{t}"), RecordOp(rec(f"r-{eid}"))]
                )
            )
            parent = eid

    async with anyio.create_task_group() as tg:
        for t in range(tasks):
            tg.start_soon(writer, t)
    return seqs


async def _one_group(s: Any, calls: dict[str, list[Any]]) -> dict[str, Any]:
    """Run each named call's ``commit_async`` concurrently; map each name to its seq or to the
    StorageError it raised."""
    outcomes: dict[str, Any] = {}

    async def commit(name: str, ops: list[Any]) -> None:
        try:
            outcomes[name] = await s.commit_async(ops)
        except StorageError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        for name, ops in calls.items():
            tg.start_soon(commit, name, ops)
    return outcomes


async def test_concurrent_commits_all_land_in_order(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p", durability="batch")
    try:
        seqs = await _writers(s)
        assert len(set(seqs)) == TASKS * PER_TASK  # each call got its own commit
        s = reopen(store, s, write=False)
        assert s.damage == []
        assert len(s.iter_entries()) == TASKS * PER_TASK
        for t in range(TASKS):
            assert s.lanes()[f"l{t}"].leaf_id == f"t{t}-{PER_TASK - 1}"
        entry_seqs = [e["seq"] for e in s.iter_entries()]
        assert entry_seqs == sorted(entry_seqs)
        # a call's entry and record are one commit: adjacent seqs
        by_id = {r["id"]: r["seq"] for r in s.records()}
        assert all(by_id[f"r-{e['id']}"] == e["seq"] + 1 for e in s.iter_entries())
    finally:
        s.close()


async def test_a_group_shares_one_fsync(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store.create_session("/p", durability="batch")
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd) or real(fd))
    try:
        await _writers(s)
        # every task commits once per round: about one fsync per round, never one per call
        assert PER_TASK <= len(calls) <= 2 * PER_TASK, len(calls)
    finally:
        s.close()


async def test_a_failing_call_fails_alone(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p", durability="batch")
    s.commit([EntryOp(ent("taken"), lane="main")])
    try:
        outcomes = await _one_group(
            s,
            {
                "a": [EntryOp(ent("a1", "taken"), lane="main")],
                "dup": [EntryOp(ent("taken"), lane="side"), RecordOp(rec("x"))],
                "b": [RecordOp(rec("b1"))],
            },
        )
        assert isinstance(outcomes["dup"], IdConflict)
        assert isinstance(outcomes["a"], int) and isinstance(outcomes["b"], int)
        s = reopen(store, s, write=False)
        assert ids(s.iter_entries()) == ["taken", "a1"]
        assert ids(s.records()) == ["b1"]  # nothing of the failed call, not even its record
        assert s.damage == []
    finally:
        s.close()


async def test_a_stale_writer_commits_nothing(store: Store, reopen: Reopen) -> None:
    a = store.create_session("/p", durability="batch")
    a.commit([EntryOp(ent("e1"), lane="main")])
    b = store.open_session(a.session_id, write=True, break_lease=True)
    failures: list[BaseException] = []

    async def commit(i: int) -> None:
        try:
            await a.commit_async([EntryOp(ent(f"late{i}", "e1"), lane=f"l{i}")])
        except StaleGeneration as exc:
            failures.append(exc)

    try:
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(commit, i)
        assert len(failures) == 4
        assert a.get_entry("late0") is None  # not even in the stale writer's own index
        a.close()
        b = reopen(store, b, write=False)
        assert ids(b.iter_entries()) == ["e1"]
    finally:
        a.close()
        b.close()


async def test_a_call_cancelled_before_its_group_is_not_committed(
    store: Store, reopen: Reopen
) -> None:
    s = store.create_session("/p", durability="batch")
    try:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await s.commit_async([EntryOp(ent("never"), lane="main")])
        assert scope.cancelled_caught
        assert await s.commit_async([EntryOp(ent("kept"), lane="main")]) > 0
        s = reopen(store, s, write=False)
        assert ids(s.iter_entries()) == ["kept"]
    finally:
        s.close()


def test_unwaited_commits_ride_on_the_next_fsync(
    store: Store, reopen: Reopen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``commit(wait=False)`` in ``sync`` mode writes without an fsync; ``wait_durable`` then
    makes all of them durable with one; a waited commit fsyncs at once (both backends fsync
    with ``os.fdatasync``: the JSONL file, or SQLite's WAL)."""
    s = store.create_session("/p", durability="sync")
    calls: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd) or real(fd))
    try:
        s.commit([EntryOp(ent("e1"), lane="main")], wait=False)
        s.commit([RecordOp(rec("r1"))], wait=False)
        assert calls == []
        s.wait_durable()
        assert len(calls) == 1
        s.wait_durable()  # nothing new: no fsync
        assert len(calls) == 1
        s.commit([EntryOp(ent("e2", "e1"), lane="main")])
        assert len(calls) == 2
        s = reopen(store, s, write=False)
        assert ids(s.iter_entries()) == ["e1", "e2"] and ids(s.records()) == ["r1"]
    finally:
        s.close()


async def test_a_malformed_call_fails_alone(store: Store, reopen: Reopen) -> None:
    """A call whose op would read back as damage (a record field of the wrong type, an entry
    that is not an object) fails with InvalidOp before anything of it is indexed; the rest
    of its group commits."""
    s = store.create_session("/p", durability="batch")
    try:
        outcomes = await _one_group(
            s,
            {
                "a": [EntryOp(ent("a1"), lane="main")],
                "not-a-dict": [EntryOp(["not", "a", "dict"], lane="x")],  # type: ignore[arg-type]
                "bad-turn": [RecordOp(rec("r-bad", "save_point", turn="3"))],
                "b": [EntryOp(ent("b1"), lane="side")],  # no parent: trio runs tasks in any order
            },
        )
        assert isinstance(outcomes["not-a-dict"], InvalidOp)
        assert isinstance(outcomes["bad-turn"], InvalidOp)
        assert outcomes["not-a-dict"].code == "invalid_op"
        assert isinstance(outcomes["a"], int) and isinstance(outcomes["b"], int)
        assert sorted(ids(s.iter_entries())) == ["a1", "b1"]
        s = reopen(store, s, write=False)
        assert sorted(ids(s.iter_entries())) == ["a1", "b1"] and s.records() == []
        assert s.damage == []
    finally:
        s.close()
