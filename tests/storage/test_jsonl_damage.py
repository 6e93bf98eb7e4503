"""Damage in JSONL session files: reported with byte offsets on open, never raised; a torn final
line is quarantined to a side file (writable opens only) and earlier bytes stay identical."""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_harness.storage import EntryOp, JsonlSessionStore, RecordOp, Store, open_store
from durable_harness.storage.jsonl import PAD_MIN as JSONL_PAD_MIN

from .conftest import Reopen
from .util import ent, ids, rec, unmarked, with_mark


@pytest.fixture
def jstore(tmp_path: Path) -> Store:
    return open_store(f"jsonl:{tmp_path}")


def _line_starts(data: bytes) -> list[int]:
    """Byte offset of every line start (a final empty remainder is not a line)."""
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        end = data.find(b"\n", pos)
        if end < 0:
            break
        pos = end + 1
    return starts


def _chain(jstore: Store, n: int = 3) -> tuple[str, bytes]:
    """A closed session of ``n`` commits (entry ``e{i}`` + record ``r{i}``): its path, bytes."""
    s = jstore.create_session("/p")
    parent = None
    for i in range(n):
        s.commit([EntryOp(ent(f"e{i}", parent), lane="main"), RecordOp(rec(f"r{i}"))])
        parent = f"e{i}"
    path = s.location
    s.close()
    return path, Path(path).read_bytes()


def _kinds(damage: list[dict[str, Any]]) -> list[str]:
    return [d["kind"] for d in damage]


# -- torn final line -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        b'{"gen":1,"ops":[{"op":"entry","entry":{"id":"x"',  # cut mid-line
        b"\x00\x00\x00",  # zeroed block at the end
        # a complete JSON commit that lacks its newline was never acknowledged: still torn
        b'{"gen":1,"ops":[{"op":"record","record":{"type":"note","id":"rx","seq":99}}]}',
    ],
    ids=["partial", "nul", "no-newline"],
)
def test_torn_tail_is_quarantined_on_writable_open(jstore: Store, tail: bytes) -> None:
    path, good = _chain(jstore)
    with open(path, "ab") as fh:
        fh.write(tail)
    offset = len(good)
    side = Path(f"{path}.torn-{offset}")

    ro = JsonlSessionStore.open_path(path, write=False)  # reports, modifies nothing
    try:
        assert _kinds(ro.damage) == ["torn_tail"]
        assert ro.damage[0]["offset"] == offset
        assert ids(ro.iter_entries()) == ["e0", "e1", "e2"]
        assert ids(ro.records()) == ["r0", "r1", "r2"]
    finally:
        ro.close()
    assert Path(path).read_bytes() == good + tail
    assert not side.exists()

    rw = JsonlSessionStore.open_path(path, write=True)
    try:
        (item,) = rw.damage
        assert item["kind"] == "torn_tail"
        assert item["offset"] == offset
        assert item["line"] == 5  # header + three commits + the torn one
        assert item["quarantined_to"] == str(side)
        assert side.read_bytes() == tail
        assert stat.S_IMODE(side.stat().st_mode) == 0o600
        assert Path(path).read_bytes() == good  # cut at the offset, earlier bytes identical
        assert ids(rw.records()) == ["r0", "r1", "r2"]

        rw.commit([EntryOp(ent("e3", "e2"), lane="main")])
    finally:
        rw.close()
    data = Path(path).read_bytes()
    assert unmarked(data).startswith(unmarked(good))  # only the mark in line 1 moved
    assert data.endswith(b"\n")
    assert data.count(b"\n") == good.count(b"\n") + 1  # one new line, not glued to the tail
    again = JsonlSessionStore.open_path(path, write=False)
    try:
        assert again.damage == []
        assert ids(again.iter_entries()) == ["e0", "e1", "e2", "e3"]
    finally:
        again.close()


# -- interior damage -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe garbage {", b"\x00" * 40, b'{"gen":1,"ops":"not a list"}', b"[1, 2, 3]"],
    ids=["bytes", "nul", "ops-not-list", "not-object"],
)
def test_bad_interior_line_is_reported_and_skipped(jstore: Store, garbage: bytes) -> None:
    path, good = _chain(jstore)
    starts = _line_starts(good)
    at = starts[2]  # before the second commit line
    damaged = good[:at] + garbage + b"\n" + good[at:]
    Path(path).write_bytes(damaged)

    for write in (False, True):
        s = JsonlSessionStore.open_path(path, write=write)
        try:
            assert _kinds(s.damage) == ["bad_line"]
            assert s.damage[0]["offset"] == at
            assert s.damage[0]["line"] == 3
            assert ids(s.iter_entries()) == ["e0", "e1", "e2"]  # later lines still load
            assert ids(s.records()) == ["r0", "r1", "r2"]
            assert s.lanes()["main"].leaf_id == "e2"
        finally:
            s.close()
        assert Path(path).read_bytes() == damaged  # reported, never repaired


def test_orphan_parent_is_reported_and_entry_readable(jstore: Store) -> None:
    path, good = _chain(jstore)
    starts = _line_starts(good)
    lines = good.split(b"\n")
    # Drop the commit line holding e1: e2 now names a parent that is missing.
    damaged = b"\n".join(lines[:2] + lines[3:])
    Path(path).write_bytes(damaged)
    s = JsonlSessionStore.open_path(path, write=False)
    try:
        # the missing line shows twice: as a gap in seq, and as e2's missing parent
        assert _kinds(s.damage) == ["seq_gap", "orphan_parent"]
        assert s.damage[0]["offset"] == starts[2]
        item = s.damage[1]
        assert item["id"] == "e2"
        assert item["parentId"] == "e1"
        assert item["offset"] == starts[2]  # e2's line moved up to where e1's line was
        e2 = s.get_entry("e2")
        assert e2 is not None and e2["parentId"] == "e1"
        assert ids(s.iter_entries()) == ["e0", "e2"]
    finally:
        s.close()


def test_duplicate_ids_are_reported_and_first_kept(jstore: Store) -> None:
    path, good = _chain(jstore)
    dup_entry = (
        b'{"gen":1,"ops":[{"op":"entry","entry":{"type":"custom","id":"e1","parentId":null,'
        b'"note":"second","seq":50}}]}\n'
    )
    dup_record = b'{"gen":1,"ops":[{"op":"record","record":{"type":"x","id":"r0","seq":51}}]}\n'
    Path(path).write_bytes(good + dup_entry + dup_record)
    s = JsonlSessionStore.open_path(path, write=False)
    try:
        assert _kinds(s.damage) == ["duplicate_id", "duplicate_id"]
        assert [d["offset"] for d in s.damage] == [len(good), len(good) + len(dup_entry)]
        assert [d["id"] for d in s.damage] == ["e1", "r0"]
        first = s.get_entry("e1")
        assert first is not None and "note" not in first and first["parentId"] == "e0"
        assert ids(s.iter_entries()) == ["e0", "e1", "e2"]
        assert [r["type"] for r in s.records()] == ["note", "note", "note"]
    finally:
        s.close()


@pytest.mark.parametrize(
    ("second", "kind"),
    [
        (b'{"op":"record","record":{"type":"x","id":"n1","seq":8}}', None),
        (
            b'{"op":"entry","entry":{"type":"custom","id":"n1","parentId":null,"seq":8}}',
            "duplicate_id",
        ),
        (
            b'{"op":"entry","entry":{"type":"custom","id":"e1","parentId":null,"seq":8}}',
            "duplicate_id",
        ),
        (b'{"op":"entry","entry":{"type":"custom","id":"n2","parentId":5,"seq":8}}', "bad_line"),
        (b'{"op":"record","record":{"type":"x","id":"n1","seq":6}}', "seq_regression"),
        (b"[]", "bad_line"),
    ],
)
def test_a_line_of_several_ops_is_indexed_whole_or_not_at_all(
    jstore: Store, second: bytes, kind: str | None
) -> None:
    """The ops of one line are checked against each other (an id twice in the line) and
    against the lines before; one op that cannot be indexed leaves out the whole line, the ops
    before it included (they name no parent, move no leaf)."""
    path, good = _chain(jstore)
    first = (
        b'{"op":"entry","lane":"side","entry":{"type":"custom","id":"n1","parentId":null,"seq":7}}'
    )
    Path(path).write_bytes(good + b'{"gen":1,"ops":[' + first + b"," + second + b"]}\n")
    s = JsonlSessionStore.open_path(path, write=False)
    try:
        if kind is None:  # an entry and a record may share an id
            assert s.damage == []
            assert ids(s.iter_entries())[-1] == "n1" and s.lane("side").leaf_id == "n1"
            return
        assert _kinds(s.damage) == [kind]
        assert s.damage[0]["offset"] == len(good)
        assert "the whole commit line is left out" in s.damage[0]["detail"]
        assert ids(s.iter_entries()) == ["e0", "e1", "e2"]
        assert set(s.lanes()) == {"main"}
    finally:
        s.close()


@pytest.mark.parametrize(
    "line",
    [
        b'{"gen":1,"ops":[{"op":"lane","seq":7}]}',
        b'{"gen":1,"ops":[{"op":"lane","lane":{},"seq":7}]}',
        b'{"gen":1,"ops":[{"op":"lane","lane":"x","leafId":[1],"seq":7}]}',
        b'{"gen":1,"ops":[{"op":"lane","lane":"x","config":"abc","seq":7}]}',
        b'{"gen":1,"ops":[{"op":"entry","entry":{"id":"z","parentId":{},"seq":7}}]}',
        b'{"gen":1,"ops":[{"op":"entry","lane":[],"entry":{"id":"z","seq":7}}]}',
        b'{"gen":1,"ops":[{"op":"record","record":{"id":"z","lane":{},"seq":7}}]}',
        b'{"gen":1,"ops":[{"op":"bogus","seq":7}]}',
        b'{"gen":"x","ops":[]}',
    ],
)
def test_malformed_ops_are_damage_not_exceptions(jstore: Store, line: bytes) -> None:
    path, good = _chain(jstore)
    Path(path).write_bytes(good + line + b"\n")
    s = JsonlSessionStore.open_path(path, write=False)
    try:
        assert _kinds(s.damage) == ["bad_line"]
        assert s.damage[0]["offset"] == len(good)
        assert ids(s.iter_entries()) == ["e0", "e1", "e2"]
        assert set(s.lanes()) == {"main"}
    finally:
        s.close()


# -- text that must not split lines or break UTF-8 -------------------------------------------

SEPARATORS = "a\u2028b\u2029c\u0085d\re\x0bf\x0cg\x1ch\x1di\x1ej\u000a k"


def test_unicode_line_separators_round_trip(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1", text=SEPARATORS), lane="main"), RecordOp(rec("r1", t=SEPARATORS))])
    s.commit([EntryOp(ent("e2", "e1"), lane="main")])
    if store.spec.startswith("jsonl:"):
        data = Path(s.location).read_bytes()
        assert "\u2028".encode() in data and "\u0085".encode() in data  # written raw
        # header + two commits, nothing split (the open writer's padding aside)
        assert data.rstrip(b"\n").count(b"\n") == 2
    s = reopen(store, s, write=False)
    try:
        assert s.damage == []
        e1 = s.get_entry("e1")
        assert e1 is not None and e1["text"] == SEPARATORS
        assert s.records()[0]["t"] == SEPARATORS
        assert ids(s.iter_entries()) == ["e1", "e2"]
    finally:
        s.close()


def test_lone_surrogate_is_written_as_replacement_char(store: Store, reopen: Reopen) -> None:
    s = store.create_session("/p")
    s.commit(
        [
            EntryOp(ent("e1", text="a\ud800b", nested=["\udfff"]), lane="main"),
            RecordOp(rec("r1", **{"k\ud83d": "v"})),
        ]
    )
    if store.spec.startswith("jsonl:"):
        Path(s.location).read_bytes().decode("utf-8")  # strict: raises on invalid UTF-8
    s = reopen(store, s, write=False)
    try:
        assert s.damage == []
        e1 = s.get_entry("e1")
        assert e1 is not None
        assert e1["text"] == "a\ufffdb"
        assert e1["nested"] == ["\ufffd"]
        assert s.records()[0]["k\ufffd"] == "v"
    finally:
        s.close()


# -- truncation at every byte offset ---------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=12)
_op = st.tuples(st.sampled_from(["entry", "record"]), _text)
_commits = st.lists(st.lists(_op, min_size=1, max_size=2), min_size=1, max_size=6)


@pytest.mark.slow
@given(commits=_commits)
def test_truncation_at_every_offset_of_the_last_lines(commits: list[list[tuple[str, str]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        s = open_store(f"jsonl:{tmp}").create_session("/p", durability="none")
        # per commit: (end offset, its entry ids, its record ids, main's leaf after it, seq)
        ends: list[tuple[int, set[str], set[str], str | None, int]] = []
        leaf: str | None = None
        n = 0
        for ops in commits:
            batch: list[Any] = []
            new_entries, new_records = set(), set()
            for kind, text in ops:
                n += 1
                if kind == "entry":
                    batch.append(
                        EntryOp(
                            {"type": "custom", "id": f"e{n}", "parentId": leaf, "t": text},
                            lane="main",
                        )
                    )
                    leaf = f"e{n}"
                    new_entries.add(leaf)
                else:
                    batch.append(RecordOp({"type": "note", "id": f"r{n}", "t": text}))
                    new_records.add(f"r{n}")
            seq = s.commit(batch)
            ends.append((os.path.getsize(s.location), new_entries, new_records, leaf, seq))
        path = s.location
        s.close()
        data = Path(path).read_bytes()
        starts = _line_starts(data)
        first_cut = starts[max(1, len(starts) - 3)]  # never cut into the header line
        bounds = [*starts, len(data)]
        mid_line_cuts = {(a + b) // 2 for a, b in itertools.pairwise(bounds)}

        for cut in range(first_cut, len(data) + 1):
            probe = os.path.join(tmp, f"cut-{cut}.jsonl")
            # What a crash during a write leaves: the mark of the last whole commit.
            durable = max((c[4] for c in ends if c[0] <= cut), default=0)
            Path(probe).write_bytes(with_mark(data[:cut], durable))
            at_boundary = cut == len(data) or data[cut - 1 : cut] == b"\n"
            # Writable opens quarantine and fsync (slow): do one mid-line cut per line.
            write = not at_boundary and cut in mid_line_cuts
            store = JsonlSessionStore.open_path(probe, write=write)
            try:
                kept = [c for c in ends if c[0] <= cut]
                want_e = set().union(*(c[1] for c in kept))
                want_r = set().union(*(c[2] for c in kept))
                assert set(ids(store.iter_entries())) == want_e, cut
                assert set(ids(store.records())) == want_r, cut
                assert store.lanes()["main"].leaf_id == (kept[-1][3] if kept else None), cut
                if at_boundary:
                    assert store.damage == [], cut
                else:
                    torn_at = max(o for o in starts if o < cut)
                    assert [(d["kind"], d["offset"]) for d in store.damage] == [
                        ("torn_tail", torn_at)
                    ], cut
                    if write:
                        assert Path(probe).read_bytes() == with_mark(data[:torn_at], durable)
                        assert Path(f"{probe}.torn-{torn_at}").read_bytes() == data[torn_at:cut]
            finally:
                store.close()
            os.unlink(probe)


def test_a_damaged_header_keeps_the_session_listed_and_openable(jstore: Store) -> None:
    path, good = _chain(jstore)
    first_end = good.index(b"\n")
    Path(path).write_bytes(b'{"type":"sess\x00' + good[first_end:])
    (info,) = jstore.list_sessions()
    assert path.endswith(f"_{info.id}.jsonl")
    s = jstore.open_session(info.id, write=False)
    try:
        assert _kinds(s.damage) == ["bad_header"]
        assert ids(s.iter_entries()) == ["e0", "e1", "e2"]
    finally:
        s.close()


# -- preallocated padding --------------------------------------------------------------------


def test_padding_is_kept_ahead_of_the_data_and_cut_off_at_close(jstore: Store) -> None:
    s = jstore.create_session("/p", durability="sync")
    s.commit([EntryOp(ent("e1"), lane="main")])
    path = s.location
    data = Path(path).read_bytes()
    content = data.rstrip(b"\n") + b"\n"
    assert len(data) - len(content) >= JSONL_PAD_MIN  # the next lines overwrite padding
    s.commit([EntryOp(ent("e2", "e1"), lane="main")])
    assert os.path.getsize(path) == len(data)  # written inside the padding: size unchanged
    s.close()
    closed = Path(path).read_bytes()
    assert unmarked(closed).startswith(unmarked(content)) and not closed.endswith(b"\n\n")
    ro = jstore.open_session(s.session_id, write=False)
    assert ids(ro.iter_entries()) == ["e1", "e2"] and ro.damage == []
    ro.close()


def test_a_writer_killed_with_padding_reopens_and_writes_over_it(jstore: Store) -> None:
    s = jstore.create_session("/p", durability="sync")
    s.commit([EntryOp(ent("e1"), lane="main")])
    path = s.location
    crashed = Path(path).read_bytes()  # what a SIGKILLed writer leaves: data, then padding
    s.close()
    Path(path).write_bytes(crashed)
    s = jstore.open_session(s.session_id)
    assert s.damage == []
    s.commit([EntryOp(ent("e2", "e1"), lane="main")])
    s.close()
    data = Path(path).read_bytes()
    # earlier bytes identical, but for the mark in line 1
    assert unmarked(data).startswith(unmarked(crashed.rstrip(b"\n") + b"\n"))
    assert data.count(b"\n\n") == 0  # the new line went where the data ended
    ro = jstore.open_session(s.session_id, write=False)
    assert ids(ro.iter_entries()) == ["e1", "e2"] and ro.damage == []
    ro.close()


def test_power_loss_inside_the_padding_at_every_offset_of_the_last_lines(
    jstore: Store,
) -> None:
    """A write cut short over the padding leaves a partial line followed by padding (the
    padding was durable before the line was written). At every cut inside the last three
    lines: no exception, every commit before the cut kept, the partial line a torn tail."""
    s = jstore.create_session("/p", durability="sync")
    parent = None
    for i in range(3):
        s.commit([EntryOp(ent(f"e{i}", parent), lane="main"), RecordOp(rec(f"r{i}"))])
        parent = f"e{i}"
    path = s.location
    data = Path(path).read_bytes()
    s.close()
    content = data.rstrip(b"\n") + b"\n"
    starts = _line_starts(content)
    ends = [b - 1 for b in [*starts[1:], len(content)]]  # offset of each line's newline
    for cut in range(starts[-3], len(content)):
        probe = Path(path).with_name(f"cut-{cut}.jsonl")
        # The mark of the last whole commit: what was durable before the cut write began.
        durable = 2 * len([end for end in ends[1:] if end <= cut])
        probe.write_bytes(with_mark(content[:cut], durable) + b"\n" * (len(data) - cut))
        # A line cut just before its newline is whole: the padding supplies that byte.
        at_boundary = b"\n" in content[cut - 1 : cut + 1]
        write = not at_boundary and cut in {(a + b) // 2 for a, b in itertools.pairwise(starts)}
        store = JsonlSessionStore.open_path(str(probe), write=write)
        try:
            whole = [i for i, end in enumerate(ends[1:]) if end <= cut]
            assert ids(store.iter_entries()) == [f"e{i}" for i in whole], cut
            if at_boundary:
                assert store.damage == [], cut
                continue
            torn_at = max(o for o in starts if o < cut)
            assert [(d["kind"], d["offset"]) for d in store.damage] == [("torn_tail", torn_at)]
            if write:
                assert probe.read_bytes() == with_mark(content[:torn_at], durable)
                assert Path(f"{probe}.torn-{torn_at}").read_bytes() == content[torn_at:cut]
                leaf = f"e{whole[-1]}" if whole else None
                store.commit([EntryOp(ent("after", leaf), lane="main")])
                assert store.lanes()["main"].leaf_id == "after"
        finally:
            store.close()
