"""The SQLite writer's cache (``storage/sql/cache.py``, ``design/storage.md`` "The writer's
cache"): the reads a run makes every turn (its lane, the leaf entry, the last seq) take no
query, and they agree with a fresh reader of the database after good commits, refused commits,
and a group in which one call fails and is rolled back to its savepoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import IdConflict, UnknownEntry
from durable_harness.storage import EntryOp, LaneOp, RecordOp, SqliteStore, open_store
from durable_harness.storage.base import SessionStore

from .util import ent, outcomes, rec, sqlite_store

pytestmark = [pytest.mark.timeout(60)]


def _view(s: SessionStore) -> tuple[Any, ...]:
    """What the per-turn reads return: every lane, ``main``'s leaf entry, the last seq."""
    lanes = {k: (v.leaf_id, v.config, v.run_id, v.run_seq) for k, v in s.lanes().items()}
    leaf = s.lane("main").leaf_id
    assert s.lane_leaf("main") == leaf and s.lane_leaf("side") == lanes.get("side", [None])[0]
    return lanes, None if leaf is None else s.get_entry(leaf), s.last_seq()


def _truth(store: SqliteStore, sid: str) -> tuple[Any, ...]:
    """The same reads from a fresh read-only session of a fresh store object (the database)."""
    with open_store(store.spec).open_session(sid, write=False) as ro:
        return _view(ro)


def _statements(s: Any) -> list[str]:
    """The statements the session's shared connections run from now on (a list to read)."""
    seen: list[str] = []
    s._shared.reader.set_trace_callback(seen.append)
    s._shared.writer.set_trace_callback(seen.append)
    return seen


def test_per_turn_reads_take_no_query_and_agree_with_the_database(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1", lane="main"))])
    s.commit([EntryOp(ent("e2", "e1"), lane="main"), LaneOp("side", leaf_id="e1", config={"k": 1})])
    s.lane("main")  # loaded once
    seen = _statements(s)
    view = _view(s)
    assert seen == []  # lanes, leaf entry and last seq from the cache
    assert view == _truth(store, s.session_id)
    assert view[1]["id"] == "e2" and view[2] == 4
    got = s.get_entry("e2")
    assert got is not None
    got["mutated"] = True  # a private copy: the cache is not changed through it
    assert "mutated" not in (s.get_entry("e2") or {})
    s.close()


def test_a_refused_commit_leaves_the_reads_as_the_database_has_them(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    before = _view(s)
    with pytest.raises(UnknownEntry):  # its entry went in before the parent check failed
        s.commit([EntryOp(ent("e2", "e1"), lane="main"), EntryOp(ent("e3", "nope"), lane="main")])
    with pytest.raises(IdConflict):
        s.commit([LaneOp("side", leaf_id="e1"), EntryOp(ent("e1"), lane="main")])
    assert _view(s) == before == _truth(store, s.session_id)
    assert s.get_entry("e2") is None
    s.commit([EntryOp(ent("e4", "e1"), lane="main")])  # numbering goes on from the database
    assert _view(s) == _truth(store, s.session_id)
    assert _view(s)[2] == 2
    s.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_call_rolled_back_in_a_group_leaves_the_reads_right(tmp_path: Path) -> None:
    """Two calls of one session in one group, the second failing: the first is committed, the
    second rolled back to its savepoint; the writer's reads show exactly the first."""
    store = sqlite_store(tmp_path)
    a = store.create_session("/p", durability="batch")
    b = store.create_session("/p", durability="batch")
    a.commit([EntryOp(ent("a0"), lane="main")])
    a.lane("main")
    out = await outcomes(
        {
            "a-ok": (a, [EntryOp(ent("a1", "a0"), lane="main"), RecordOp(rec("ra"))]),
            "a-bad": (a, [LaneOp("side", leaf_id="a1"), RecordOp(rec("ra"))]),
            "b-ok": (b, [EntryOp(ent("b1"), lane="main")]),
        }
    )
    assert isinstance(out["a-ok"], int) and isinstance(out["b-ok"], int)
    assert isinstance(out["a-bad"], IdConflict)
    assert _view(a) == _truth(store, a.session_id)
    assert _view(a)[1]["id"] == "a1" and "side" not in _view(a)[0]
    assert _view(b) == _truth(store, b.session_id)
    for s in (a, b):
        s.close()


def test_a_reader_never_answers_from_a_cache(tmp_path: Path) -> None:
    """A read-only session sees another writer's commits as soon as they are committed."""
    store = sqlite_store(tmp_path)
    w = store.create_session("/p")
    w.commit([EntryOp(ent("e1"), lane="main")])
    ro = open_store(store.spec).open_session(w.session_id, write=False)
    assert ro.lane("main").leaf_id == "e1"
    w.commit([EntryOp(ent("e2", "e1"), lane="main")])
    assert ro.lane("main").leaf_id == "e2" and ro.last_seq() == 2
    ro.close()
    w.close()
