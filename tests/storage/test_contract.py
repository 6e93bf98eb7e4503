"""The storage contract of ``storage/base.py``, checked on every backend (``conftest.store``)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import (
    AmbiguousSessionPrefix,
    IdConflict,
    InvalidOp,
    ReadOnlySession,
    SessionExists,
    SessionNotFound,
    UnknownEntry,
)
from durable_harness.storage import DURABILITY_MODES, EntryOp, LaneOp, RecordOp, Store, open_store

from .conftest import Reopen
from .util import ent, ids, rec, snapshot


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- catalogue -------------------------------------------------------------------------------


def test_create_open_close(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/work/proj")
    sid = s.session_id
    assert s.header["cwd"] == "/work/proj"
    assert s.header["id"] == sid
    assert not s.read_only
    assert s.generation >= 1
    assert s.last_seq() == 0
    assert s.entry_count() == 0
    assert s.iter_entries() == []
    assert s.records() == []
    lanes = s.lanes()
    assert set(lanes) == {"main"}
    assert lanes["main"].leaf_id is None
    assert lanes["main"].run_id is None

    assert [i.id for i in store.list_sessions("/work/proj")] == [sid]
    assert store.list_sessions("/elsewhere") == []
    assert [i.id for i in store.list_sessions()] == [sid]

    s.close()
    s.close()  # idempotent

    again = store.open_session(sid)
    try:
        assert again.session_id == sid
        assert again.header["cwd"] == "/work/proj"
        assert not again.read_only
    finally:
        again.close()

    with pytest.raises(SessionNotFound):
        store.open_session("no-such-session")


def test_open_by_unique_prefix(store: Store) -> None:
    store.create_session("/p", session_id="aaaa1111-0000-7000-8000-000000000001").close()
    store.create_session("/p", session_id="bbbb2222-0000-7000-8000-000000000002").close()
    s = store.open_session("aaaa", write=False)
    try:
        assert s.session_id == "aaaa1111-0000-7000-8000-000000000001"
    finally:
        s.close()
    assert store.resolve("bbbb2").id == "bbbb2222-0000-7000-8000-000000000002"
    # An exact id wins even when it is also a prefix of another id.
    store.create_session("/p", session_id="cccc").close()
    store.create_session("/p", session_id="cccc-longer").close()
    assert store.resolve("cccc").id == "cccc"


def test_ambiguous_prefix_lists_candidates(store: Store) -> None:
    first, second = "abcd0001-0000-7000-8000-000000000001", "abcd0002-0000-7000-8000-000000000002"
    for sid in (second, first, "ffff0003-0000-7000-8000-000000000003"):
        store.create_session("/p", session_id=sid).close()
    with pytest.raises(AmbiguousSessionPrefix) as info:
        store.open_session("abcd000")
    assert info.value.details["candidates"] == [first, second]
    assert first in str(info.value) and second in str(info.value)
    assert info.value.code == "ambiguous_session_prefix"
    with pytest.raises(SessionNotFound):
        store.open_session("0123")


def test_session_exists_on_duplicate_id(store: Store) -> None:
    sid = "dddd0001-0000-7000-8000-000000000001"
    s = store.create_session("/p", session_id=sid)
    s.commit([EntryOp(ent("e1"), lane="main")])
    s.close()
    with pytest.raises(SessionExists):
        store.create_session("/p", session_id=sid)
    with pytest.raises(SessionExists):
        store.create_session("/other-cwd", session_id=sid)
    # The existing session is untouched.
    s = store.open_session(sid, write=False)
    try:
        assert ids(s.iter_entries()) == ["e1"]
    finally:
        s.close()
    assert len(store.list_sessions()) == 1


# -- commits ---------------------------------------------------------------------------------


def test_multi_op_commit_is_atomic(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("root"), lane="main"), RecordOp(rec("r0"))])
    before = snapshot(s)
    bad_batches = [
        # 2nd op names a parent that does not exist
        [EntryOp(ent("a", "root"), lane="main"), EntryOp(ent("b", "missing")), RecordOp(rec("r1"))],
        # a later lane op names a leaf that does not exist
        [EntryOp(ent("a", "root")), RecordOp(rec("r1")), LaneOp("main", leaf_id="missing")],
        # a parent that is a record id, not an entry id
        [RecordOp(rec("r1")), EntryOp(ent("a", "r1"), lane="main")],
        # a leaf that is a record id, not an entry id
        [RecordOp(rec("r1")), LaneOp("side", leaf_id="r1")],
    ]
    for batch in bad_batches:
        with pytest.raises(UnknownEntry):
            s.commit(batch)
        assert snapshot(s) == before
        assert s.get_entry("a") is None
        assert s.records(types=("note",)) == [before["records"][0]]
    s = reopen(store, s)
    try:
        assert snapshot(s) == before
        assert "side" not in s.lanes()
        # The session stays writable and seq continues right after the last good commit.
        seq = s.commit([EntryOp(ent("a", "root"), lane="main")])
        assert seq == before["last_seq"] + 1
    finally:
        s.close()


def test_seq_strictly_increases_across_kinds(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    returned = [
        s.commit([EntryOp(ent("e1"), lane="main")]),
        s.commit([RecordOp(rec("r1"))]),
        s.commit([LaneOp("main", leaf_id=None)]),
        s.commit([LaneOp("side", config={"model": "m"})]),
        s.commit([EntryOp(ent("e2", "e1"), lane="main"), RecordOp(rec("r2")), LaneOp("side")]),
    ]
    # Each op takes exactly one seq: 1, 2, 3, 4, then 5, 6, 7 in one commit.
    assert returned == [1, 2, 3, 4, 7]
    assert s.last_seq() == 7
    s = reopen(store, s)
    try:
        assert s.last_seq() == 7
        by_id = {e["id"]: e["seq"] for e in s.iter_entries()}
        by_id.update({r["id"]: r["seq"] for r in s.records()})
        assert by_id == {"e1": 1, "r1": 2, "e2": 5, "r2": 6}
        assert s.commit([RecordOp(rec("r3"))]) == 8
        seqs = [x["seq"] for x in s.iter_entries()] + [x["seq"] for x in s.records()]
        assert len(seqs) == len(set(seqs))
    finally:
        s.close()


def test_id_conflict_for_entries_and_records(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1"))])
    before = snapshot(s)
    conflicting = [
        [EntryOp(ent("e1"))],
        [EntryOp(ent("fresh")), EntryOp(ent("fresh"))],
        [RecordOp(rec("r1"))],
        [EntryOp(ent("fresh2")), RecordOp(rec("r9")), RecordOp(rec("r9"))],
    ]
    for batch in conflicting:
        with pytest.raises(IdConflict) as info:
            s.commit(batch)
        assert info.value.code == "id_conflict"
        assert snapshot(s) == before
    s = reopen(store, s)
    try:
        assert snapshot(s) == before
        assert s.get_entry("e1") == before["entries"][0]
    finally:
        s.close()


@pytest.mark.parametrize(
    "bad",
    [
        [EntryOp(["not", "an", "object"])],  # type: ignore[arg-type]
        [EntryOp({**ent("e2", "e1"), "type": "message", "message": {"role": 3}})],
        [EntryOp(ent("e2", "e1"), lane=7)],  # type: ignore[arg-type]
        [EntryOp(ent("e2", "e1"), lane="main"), RecordOp(rec("r2", "save_point", turn="3"))],
        [RecordOp(rec("r2", "tool_started", arguments=["not", "an", "object"]))],
        [LaneOp("side", config="not an object")],  # type: ignore[arg-type]
    ],
    ids=["entry-not-object", "bad-role", "lane-int", "turn-str", "args-list", "config-str"],
)
def test_an_op_that_would_read_back_as_damage_is_refused(
    store: Store, reopen: Reopen, bad: list[Any]
) -> None:
    """A commit runs the shape checks reading runs: what it accepts never reads back as
    damage, and what it refuses leaves nothing behind."""
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    before = snapshot(s)
    with pytest.raises(InvalidOp) as info:
        s.commit(bad)
    assert info.value.code == "invalid_op"
    assert snapshot(s) == before
    s = reopen(store, s, write=False)
    try:
        assert s.damage == []
    finally:
        s.close()


def test_lane_leaf_moves_are_durable(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("a"), lane="main")])
    s.commit([EntryOp(ent("b", "a"), lane="main")])
    s.commit([LaneOp("main", leaf_id="a")])  # the last commit: no later append
    s = reopen(store, s)
    assert s.lanes()["main"].leaf_id == "a"
    s.commit([LaneOp("main", leaf_id=None)])
    s = reopen(store, s)
    assert s.lanes()["main"].leaf_id is None
    s.commit([LaneOp("side", leaf_id="b", config={"model": "x", "thinking": "low"})])
    s.commit([LaneOp("side", config={"thinking": "high"})])  # config merges; leaf stays
    s = reopen(store, s)
    try:
        side = s.lanes()["side"]
        assert side.leaf_id == "b"
        assert side.config == {"model": "x", "thinking": "high"}
        assert s.lanes()["main"].leaf_id is None
    finally:
        s.close()


def test_run_records_keep_lane_run_id_in_step(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    seq = s.commit([RecordOp(rec("s1", "run_started", runId="run-1"))])
    assert (s.lanes()["main"].run_id, s.lanes()["main"].run_seq) == ("run-1", seq)
    s = reopen(store, s)
    assert (s.lanes()["main"].run_id, s.lanes()["main"].run_seq) == ("run-1", seq)

    # Another lane's run and another run's finish leave this run open.
    s.commit([RecordOp(rec("s2", "run_started", lane="side", runId="run-2"))])
    s.commit([RecordOp(rec("f9", "run_finished", runId="run-other", outcome="completed"))])
    s = reopen(store, s)
    lanes = s.lanes()
    assert lanes["main"].run_id == "run-1"
    assert lanes["side"].run_id == "run-2"

    s.commit([RecordOp(rec("f1", "run_finished", runId="run-1", outcome="completed"))])
    assert s.lanes()["main"].run_id is None
    s = reopen(store, s)
    try:
        lanes = s.lanes()
        assert (lanes["main"].run_id, lanes["main"].run_seq) == (None, None)
        assert lanes["side"].run_id == "run-2"
        # A run settled in the same commit that opens it leaves the lane idle.
        s.commit(
            [
                RecordOp(rec("s3", "run_started", runId="run-3")),
                RecordOp(rec("f3", "run_finished", runId="run-3", outcome="declined")),
            ]
        )
        assert s.lanes()["main"].run_id is None
    finally:
        s.close()


def test_records_filters(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit([RecordOp(rec("a1", "run_started", runId="A"))])
    s.commit([RecordOp(rec("a2", "tool_started", runId="A"))])
    s.commit([RecordOp(rec("b1", "run_started", lane="side", runId="B"))])
    s.commit([RecordOp(rec("a3", "run_finished", runId="A", outcome="completed"))])
    s.commit([RecordOp(rec("n1", "note", lane=None))])
    s = reopen(store, s, write=False)
    try:
        assert ids(s.records()) == ["a1", "a2", "b1", "a3", "n1"]
        assert ids(s.records("main")) == ["a1", "a2", "a3"]
        assert ids(s.records("side")) == ["b1"]
        assert ids(s.records(run_id="A")) == ["a1", "a2", "a3"]
        assert ids(s.records("side", run_id="A")) == []
        assert ids(s.records(since_seq=3)) == ["a3", "n1"]
        assert ids(s.records(types=("run_started", "run_finished"))) == ["a1", "b1", "a3"]
        assert ids(s.records("main", run_id="A", since_seq=1, types=("tool_started",))) == ["a2"]
        assert s.records("nope") == []
        assert [r["seq"] for r in s.records()] == [1, 2, 3, 4, 5]
    finally:
        s.close()


def test_read_only_open_refuses_commit(store: Store) -> None:
    writer = store.create_session("/p")
    writer.commit([EntryOp(ent("e1"), lane="main")])
    ro = store.open_session(writer.session_id, write=False)  # works while the writer is live
    try:
        assert ro.read_only
        assert ro.generation == 0
        assert ids(ro.iter_entries()) == ["e1"]
        with pytest.raises(ReadOnlySession) as info:
            ro.commit([EntryOp(ent("e2", "e1"), lane="main")])
        assert info.value.code == "read_only"
        with pytest.raises(ReadOnlySession):
            ro.commit([LaneOp("main", leaf_id=None)])
    finally:
        ro.close()
    assert writer.get_entry("e2") is None
    assert writer.lanes()["main"].leaf_id == "e1"
    writer.commit([EntryOp(ent("e2", "e1"), lane="main")])  # the writer is unaffected
    writer.close()


@pytest.mark.parametrize("durability", DURABILITY_MODES)
def test_durability_modes_round_trip(store: Store, reopen: Reopen, durability: str) -> None:
    s = store.create_session("/p", durability=durability)  # type: ignore[arg-type]
    assert s.durability == durability
    parent = None
    for i in range(5):
        s.commit([EntryOp(ent(f"e{i}", parent, n=i), lane="main"), RecordOp(rec(f"r{i}"))])
        parent = f"e{i}"
    before = snapshot(s)
    s = reopen(store, s, durability=durability)
    try:
        assert s.durability == durability
        assert snapshot(s) == before
        assert s.lanes()["main"].leaf_id == "e4"
        assert [e["n"] for e in s.iter_entries()] == [0, 1, 2, 3, 4]
    finally:
        s.close()


def test_batch_mode_concurrent_commits(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p", durability="batch")
    threads, per_thread = 16, 8
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        try:
            start.wait()
            got = []
            parent = None
            for i in range(per_thread):
                eid = f"t{t}-e{i}"
                got.append(
                    s.commit(
                        [EntryOp(ent(eid, parent), lane=f"lane{t}"), RecordOp(rec(f"t{t}-r{i}"))]
                    )
                )
                parent = eid
            results[t] = got
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not errors
    assert all(not w.is_alive() for w in workers)
    assert sorted(results) == list(range(threads))
    returned = [seq for t in results for seq in results[t]]
    assert len(set(returned)) == threads * per_thread
    for t in results:  # each thread's own commits are ordered
        assert results[t] == sorted(results[t])

    s = reopen(store, s, write=False)
    try:
        entries, records = s.iter_entries(), s.records()
        assert len(entries) == len(records) == threads * per_thread
        seqs = [e["seq"] for e in entries] + [r["seq"] for r in records]
        assert len(set(seqs)) == len(seqs)
        assert sorted(seqs) == list(range(1, 2 * threads * per_thread + 1))
        assert set(returned) == {r["seq"] for r in records}
        lanes = s.lanes()
        for t in range(threads):
            assert lanes[f"lane{t}"].leaf_id == f"t{t}-e{per_thread - 1}"
    finally:
        s.close()


def test_file_permissions(store: Store, tmp_path: Path) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    try:
        if store.spec.startswith("jsonl:"):
            path = s.location
            assert _mode(path) == 0o600
            assert _mode(os.path.dirname(path)) == 0o700
            assert _mode(path + ".lock") == 0o600
        else:
            db = tmp_path / "s.db"
            assert _mode(db) == 0o600
            for side in ("s.db-wal", "s.db-shm"):
                if (tmp_path / side).exists():
                    assert _mode(tmp_path / side) == 0o600, side
            locks = tmp_path / "s.db.locks"
            assert _mode(locks) == 0o700
            assert {_mode(p) for p in locks.iterdir()} == {0o600}
    finally:
        s.close()


def test_returned_dicts_are_copies(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1", body={"k": [1]}), lane="main"), RecordOp(rec("r1"))])
    s = reopen(store, s)
    try:
        got = s.get_entry("e1")
        assert got is not None
        got["body"]["k"].append(2)
        got["parentId"] = "mutated"
        s.iter_entries()[0]["body"]["k"].append(3)
        assert s.get_entry("e1") == {**ent("e1", body={"k": [1]}), "seq": 1}
    finally:
        s.close()


def test_jsonl_decodes_each_commit_line_once_per_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit of many entries (as an import writes) must not be re-read for every entry."""
    s = open_store(f"jsonl:{tmp_path}").create_session("/p")
    ops = [EntryOp(ent(f"e{i}", f"e{i - 1}" if i else None, pad="x" * 200)) for i in range(300)]
    s.commit([*ops, LaneOp("main", leaf_id="e299")])
    s.commit([EntryOp(ent("tail", "e299"), lane="main")])
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(offset)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    try:
        assert len(s.iter_entries()) == 301
        assert len(reads) <= 2
        reads.clear()
        leaf = "tail"
        walked = 0
        while leaf is not None:  # a leaf-to-root walk, as building a context does
            entry = s.get_entry(leaf)
            assert entry is not None
            leaf = entry["parentId"]
            walked += 1
        assert walked == 301
        assert len(reads) <= 2
    finally:
        monkeypatch.undo()
        s.close()
