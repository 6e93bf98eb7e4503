"""Attacks on the SQLite writer's cache (``storage/sql/cache.py``, ``design/storage.md`` "The
writer's cache"): its answers must equal what a fresh read-only session reads.

Failing as of this commit:

* after a commit refused with ``StaleGeneration`` (another process broke the lease and wrote),
  the old writer still answers ``last_seq``/``lane``/``lanes`` from its cache, which is not
  dropped: it shows the database as it was before the other writer's commits;
* the cache keeps the caller's ``LaneOp.config`` object itself and hands out lanes whose
  ``config`` shares its nested values: mutating either (the op's dict after the commit, or a
  list inside ``lane().config``) changes what the writer reads, not what the database holds;
* the cache keeps the config as given, not as stored: a tuple (stored as a list), a lone
  surrogate (stored as U+FFFD, see ``codec.dumps_held``), NaN/inf (stored as ``null``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import StaleGeneration
from durable_harness.storage import EntryOp, LaneOp, SqliteStore, open_store
from durable_harness.storage.base import SessionStore

from .util import ent, outcomes, sqlite_store

pytestmark = [pytest.mark.timeout(60)]


def _view(s: SessionStore) -> tuple[Any, ...]:
    lanes = {k: vars(v) for k, v in s.lanes().items()}
    return lanes, vars(s.lane("main")), s.last_seq()


def _truth(store: SqliteStore, sid: str) -> tuple[Any, ...]:
    with open_store(store.spec).open_session(sid, write=False) as ro:
        return _view(ro)


BREAK_AND_WRITE = """
import sys
from durable_harness.storage import EntryOp, open_store
from durable_harness.testing.conformance import ent
spec, sid = sys.argv[1:]
with open_store(spec).open_session(sid, write=True, break_lease=True) as s:
    s.commit([EntryOp(ent("other", "e1"), lane="main"), EntryOp(ent("o2", "other"), lane="side")])
"""


@pytest.mark.parametrize("how", ["sync", "batch-thread", "batch-task"])
def test_after_stale_generation_the_old_writer_reads_the_database(tmp_path: Path, how: str) -> None:
    store = sqlite_store(tmp_path)
    s = store.create_session("/p", durability="sync" if how == "sync" else "batch")
    s.commit([EntryOp(ent("e1"), lane="main")])
    s.lane("main")  # the cache is loaded
    subprocess.run(
        [sys.executable, "-c", BREAK_AND_WRITE, store.spec, s.session_id], check=True, timeout=30
    )
    ops = [EntryOp(ent("mine", "e1"), lane="main")]
    if how == "batch-task":
        import anyio

        out = anyio.run(outcomes, {"c": (s, ops)})
        assert isinstance(out["c"], StaleGeneration)
    else:
        with pytest.raises(StaleGeneration):
            s.commit(ops)
    # The writer now knows it is fenced out: it must not keep answering from its old view.
    assert _view(s) == _truth(store, s.session_id)
    s.close()


def test_mutating_a_lane_s_config_does_not_change_the_cache(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    s = store.create_session("/p")
    s.lane("main")  # the cache is loaded
    s.commit([LaneOp("main", config={"tools": ["read"]})])
    s.lane("main").config["tools"].append("bash")  # the caller's copy
    for lane in s.lanes().values():
        for value in lane.config.values():
            if isinstance(value, list):
                value.append("edit")
    assert _view(s) == _truth(store, s.session_id)
    assert s.lane("main").config == {"tools": ["read"]}
    s.close()


def test_mutating_the_committed_op_s_config_does_not_change_the_cache(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path)
    s = store.create_session("/p")
    s.lane("main")
    config: dict[str, Any] = {"tools": ["read"], "model": {"id": "a"}}
    s.commit([LaneOp("main", config=config)])
    config["tools"].append("bash")  # the caller reuses its dict after the commit
    config["model"]["id"] = "b"
    assert _view(s) == _truth(store, s.session_id)
    s.close()


@pytest.mark.parametrize(
    "config",
    [{"t": (1, 2)}, {"s": "a\ud800b"}, {"n": float("nan")}, {"f": float("inf")}],
    ids=["tuple", "lone-surrogate", "nan", "inf"],
)
def test_the_cache_holds_the_config_as_stored(tmp_path: Path, config: dict[str, Any]) -> None:
    store = sqlite_store(tmp_path)
    s = store.create_session("/p")
    s.lane("main")
    s.commit([LaneOp("main", config=config)])
    assert repr(_view(s)) == repr(_truth(store, s.session_id))
    s.close()
