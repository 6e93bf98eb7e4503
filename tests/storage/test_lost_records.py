"""Lost or altered records are seen (issue 9, section 4), on the storage side: a deleted row or
line, a corrupt row body, a deleted header line, a file cut at a line boundary. Each is a damage
item naming its kind and where it is, found by the store's own scan."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from durable_harness.storage import (
    EntryOp,
    JsonlSessionStore,
    LaneOp,
    RecordOp,
    SessionStore,
    Store,
    open_store,
)
from durable_harness.storage.jsonl import MARK_KEY, mark_text, parse_mark

from .util import ent, ids, rec


def _kinds(store: SessionStore) -> list[str]:
    return [d["kind"] for d in store.damage]


def _session(store: Store, n: int = 4) -> SessionStore:
    """``n`` commits of entry ``e{i}`` + record ``r{i}`` (seqs 2i+1, 2i+2), then a lane op."""
    s = store.create_session("/p")
    parent = None
    for i in range(n):
        s.commit([EntryOp(ent(f"e{i}", parent), lane="main"), RecordOp(rec(f"r{i}"))])
        parent = f"e{i}"
    s.commit([LaneOp("side", leaf_id="e0")])  # a lane op uses a seq too: no gap from it
    return s


# -- SQLite ------------------------------------------------------------------------------------


@pytest.fixture
def sq(tmp_path: Path) -> Store:
    return open_store(f"sqlite:{tmp_path / 's.db'}")


def _sql(store: Store, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(store.spec.removeprefix("sqlite:"))
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def test_sqlite_clean_session_with_lane_ops_has_no_damage(sq: Store) -> None:
    s = _session(sq)
    s.commit([LaneOp("side", config={"model": "m"})])
    sid = s.session_id
    s.close()
    ro = sq.open_session(sid, write=False)
    assert ro.damage == [] and ro.last_seq() == 10
    ro.close()


def test_sqlite_deleted_interior_row_is_a_seq_gap_naming_the_row_after_it(sq: Store) -> None:
    s = _session(sq)
    sid = s.session_id
    s.close()
    _sql(sq, "DELETE FROM records WHERE id='r1'")  # seq 4, between e1 (3) and e2 (5)
    ro = sq.open_session(sid, write=False)
    (gap,) = ro.damage
    assert (gap["kind"], gap["after"], gap["seq"], gap["missing"]) == ("seq_gap", 3, 5, 1)
    assert (gap["table"], gap["id"]) == ("entries", "e2")
    ro.close()


def test_sqlite_deleted_last_rows_are_truncated_against_last_seq(sq: Store) -> None:
    s = sq.create_session("/p")
    s.commit([EntryOp(ent("e0"), lane="main")])
    s.commit([RecordOp(rec("started", "tool_started", toolCallId="c1", toolName="bash"))])
    sid = s.session_id
    s.close()
    _sql(sq, "DELETE FROM records WHERE id='started'")
    ro = sq.open_session(sid, write=False)
    (cut,) = ro.damage
    assert (cut["kind"], cut["expected"], cut["found"]) == ("truncated", 2, 1)
    assert (cut["table"], cut["seq"]) == ("sessions", 2)
    assert ro.records() == []
    ro.close()
    # A writer goes on numbering past last_seq: the hole stays visible after new commits.
    rw = sq.open_session(sid)
    assert rw.commit([RecordOp(rec("later"))]) == 3
    rw.close()
    ro = sq.open_session(sid, write=False)
    assert [(d["kind"], d["after"], d["seq"], d["id"]) for d in ro.damage] == [
        ("seq_gap", 1, 3, "later")
    ]
    ro.close()


@pytest.mark.parametrize(
    "body",
    [b'{"garbage', b"[1,2]", b'{"type":"note","id":"r1","lane":"main","seq":99}'],
    ids=["not-json", "not-object", "altered-seq"],
)
def test_sqlite_corrupt_row_body_names_table_id_and_seq(sq: Store, body: bytes) -> None:
    s = _session(sq)
    sid = s.session_id
    s.close()
    _sql(sq, "UPDATE records SET body=? WHERE id='r1'", body)
    ro = sq.open_session(sid, write=False)
    (bad,) = ro.damage  # found by the scan, before anything reads the row
    assert (bad["kind"], bad["table"], bad["id"], bad["seq"]) == ("bad_row", "records", "r1", 4)
    assert "r1" not in ids(ro.records())
    assert ro.damage == [bad]  # reading the row again reports nothing new
    ro.close()


def test_sqlite_a_read_before_the_scan_reports_the_same_item(sq: Store) -> None:
    s = _session(sq)
    sid = s.session_id
    s.close()
    _sql(sq, "UPDATE entries SET body=? WHERE id='e2'", b"not json")
    ro = sq.open_session(sid, write=False)
    assert ro.get_entry("e2") is None  # the read reports it, then the scan runs once
    assert [(d["kind"], d["table"], d["id"], d["seq"]) for d in ro.damage] == [
        ("bad_row", "entries", "e2", 5)
    ]
    ro.close()


def test_sqlite_sessions_from_before_lane_op_rows_are_checked_from_their_migration(
    tmp_path: Path,
) -> None:
    """A database made at schema 1 (lane ops had no rows) migrates with ``checked_from`` at
    each session's ``last_seq``: its old seqs raise no false gap, its new ones are checked."""
    from durable_harness.storage import sqlite as backend

    db = str(tmp_path / "old.db")
    saved = backend.MIGRATIONS[:]
    backend.MIGRATIONS[:] = saved[:1]
    try:
        old = open_store(f"sqlite:{db}")
        s = old.create_session("/p")
        s.commit([EntryOp(ent("e0"), lane="main")])
        s.commit([LaneOp("side", leaf_id="e0")])  # seq 2: no row at schema 1
        s.commit([RecordOp(rec("r0"))])
        sid = s.session_id
        s.close()
    finally:
        backend.MIGRATIONS[:] = saved
    store = open_store(f"sqlite:{db}")
    rw = store.open_session(sid)
    assert rw.damage == []
    rw.commit([LaneOp("side", leaf_id=None)])
    rw.commit([RecordOp(rec("r1"))])
    rw.close()
    _sql(store, "DELETE FROM lane_ops WHERE seq=4")
    ro = store.open_session(sid, write=False)
    assert [(d["kind"], d["after"], d["seq"]) for d in ro.damage] == [("seq_gap", 3, 5)]
    ro.close()


# -- JSONL -------------------------------------------------------------------------------------


@pytest.fixture
def js(tmp_path: Path) -> Store:
    return open_store(f"jsonl:{tmp_path / 'home'}")


def _lines(path: str) -> list[bytes]:
    return Path(path).read_bytes().rstrip(b"\n").split(b"\n")


def _closed(js: Store, n: int = 4) -> tuple[str, str]:
    s = _session(js, n)
    sid, path = s.session_id, s.location
    s.close()
    return sid, path


def test_jsonl_deleted_header_line_is_missing_header_and_every_commit_is_read(js: Store) -> None:
    sid, path = _closed(js)
    lines = _lines(path)
    Path(path).write_bytes(b"\n".join(lines[1:]) + b"\n")
    ro = JsonlSessionStore.open_path(path, write=False)
    try:
        (item,) = ro.damage
        assert (item["kind"], item["offset"], item["line"]) == ("missing_header", 0, 1)
        assert ro.session_id == sid
        assert ids(ro.iter_entries()) == ["e0", "e1", "e2", "e3"]  # e0's line is not swallowed
        assert ids(ro.records()) == ["r0", "r1", "r2", "r3"]
        assert ro.last_seq() == 9
    finally:
        ro.close()
    assert [i.id for i in js.list_sessions()] == [sid]  # still listed


def test_jsonl_deleted_header_of_a_one_commit_file(js: Store) -> None:
    s = js.create_session("/p")
    s.commit([EntryOp(ent("only"), lane="main")])
    sid, path = s.session_id, s.location
    s.close()
    Path(path).write_bytes(_lines(path)[1] + b"\n")
    assert [i.id for i in js.list_sessions()] == [sid]
    ro = js.open_session(sid, write=False)
    assert _kinds(ro) == ["missing_header"] and ids(ro.iter_entries()) == ["only"]
    ro.close()


def test_jsonl_clean_cut_at_every_line_boundary_is_truncated(js: Store) -> None:
    sid, path = _closed(js)
    data = Path(path).read_bytes()
    lines = _lines(path)
    ends = [len(b"\n".join(lines[: k + 1])) + 1 for k in range(len(lines))]
    for k, cut in enumerate(ends[:-1]):  # keep the header and k commit lines
        Path(path).write_bytes(data[:cut])
        ro = JsonlSessionStore.open_path(path, write=False)
        try:
            (item,) = ro.damage
            found = 2 * k
            assert (item["kind"], item["expected"], item["found"]) == ("truncated", 9, found)
            assert (item["offset"], item["line"]) == (cut, k + 2)
            assert ro.last_seq() == found
        finally:
            ro.close()
    Path(path).write_bytes(data)
    ro = js.open_session(sid, write=False)
    assert ro.damage == []
    ro.close()


def test_jsonl_a_writer_after_a_cut_numbers_past_the_mark_so_the_hole_stays(js: Store) -> None:
    sid, path = _closed(js)
    data = Path(path).read_bytes()
    lines = _lines(path)
    Path(path).write_bytes(b"\n".join(lines[:3]) + b"\n")  # header + 2 commits: seq 4 left
    rw = js.open_session(sid)
    assert [(d["kind"], d["expected"], d["found"]) for d in rw.damage] == [("truncated", 9, 4)]
    assert rw.commit([RecordOp(rec("after"))]) == 10
    rw.close()
    ro = js.open_session(sid, write=False)
    assert [(d["kind"], d["after"], d["seq"], d["line"]) for d in ro.damage] == [
        ("seq_gap", 4, 10, 4)
    ]
    ro.close()
    assert len(data) > 0


def test_jsonl_deleted_interior_line_is_a_seq_gap_with_its_offset(js: Store) -> None:
    _sid, path = _closed(js)
    lines = _lines(path)
    del lines[2]  # the commit of e1/r1 (seqs 3, 4)
    Path(path).write_bytes(b"\n".join(lines) + b"\n")
    ro = JsonlSessionStore.open_path(path, write=False)
    try:
        gap, orphan = ro.damage
        assert (orphan["kind"], orphan["id"], orphan["parentId"]) == ("orphan_parent", "e2", "e1")
        offset = len(b"\n".join(lines[:2])) + 1
        assert (gap["kind"], gap["after"], gap["seq"], gap["missing"]) == ("seq_gap", 2, 5, 2)
        assert (gap["offset"], gap["line"]) == (offset, 3)
    finally:
        ro.close()


def test_jsonl_an_altered_mark_is_bad_mark(js: Store) -> None:
    _sid, path = _closed(js)
    data = Path(path).read_bytes()
    at, seq = parse_mark(data[: data.index(b"\n")])
    assert at is not None and seq == 9
    Path(path).write_bytes(data[:at] + b"00000000000000000099" + data[at + 20 :])
    ro = JsonlSessionStore.open_path(path, write=False)
    try:
        assert [(d["kind"], d["offset"], d["line"]) for d in ro.damage] == [("bad_mark", at, 1)]
    finally:
        ro.close()


def test_jsonl_the_mark_never_claims_an_unsynced_commit(js: Store) -> None:
    """The mark moves only after the fsync that made its seq durable: a commit written but not
    yet fsynced (``wait=False``) is not claimed, and is claimed once a barrier covers it."""

    def mark(path: str) -> int | None:
        data = Path(path).read_bytes()
        return parse_mark(data[: data.index(b"\n")])[1]

    for durability in ("sync", "batch"):
        s = js.create_session("/p", durability=durability)  # type: ignore[arg-type]
        s.commit([EntryOp(ent("e0"), lane="main")])
        assert mark(s.location) == 1
        s.commit([RecordOp(rec("r0"))], wait=False)
        assert mark(s.location) == 1, durability
        s.wait_durable()
        assert mark(s.location) == 2, durability
        assert MARK_KEY not in s.header
        s.close()


def test_jsonl_a_file_without_a_mark_opens_without_a_truncation_check(js: Store) -> None:
    _sid, path = _closed(js)
    data = Path(path).read_bytes()
    first = data.index(b"\n")
    at, _ = parse_mark(data[:first])
    assert at is not None
    field = b',"' + MARK_KEY.encode() + b'":"' + mark_text(9).encode() + b'"'
    header = data[:first].replace(field, b"")
    assert header != data[:first]
    lines = (header + data[first:]).rstrip(b"\n").split(b"\n")
    Path(path).write_bytes(b"\n".join(lines[:2]) + b"\n")
    ro = JsonlSessionStore.open_path(path, write=False)
    try:
        assert ro.damage == [] and ro.last_seq() == 2
    finally:
        ro.close()
    assert os.path.getsize(path) > 0
