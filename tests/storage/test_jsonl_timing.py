"""The JSONL backend reports commit and fsync latency to :mod:`durable_harness.storage.timing`
(what the host's ``/metrics`` histograms are fed from), and only while someone listens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from durable_harness.storage import Durability, EntryOp, RecordOp, open_store, timing

from .util import ent, rec

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def observed() -> Iterator[list[tuple[str, float]]]:
    """Every ``(what, seconds)`` reported while the test runs."""
    seen: list[tuple[str, float]] = []
    remove = timing.add_observer(lambda what, s: seen.append((what, s)))
    yield seen
    remove()


def _kinds(seen: list[tuple[str, float]]) -> list[str]:
    return [what for what, _ in seen]


@pytest.mark.parametrize("mode", ["sync", "batch"])
def test_durable_commit_reports_commit_and_fsync(
    tmp_path: Path, observed: list[tuple[str, float]], mode: Durability
) -> None:
    session = open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path), durability=mode)
    observed.clear()  # creating the file is not a commit of the write path
    session.commit([EntryOp(ent("a", None)), RecordOp(rec("r1"))])
    assert _kinds(observed) == ["fsync", "commit"]  # the fsync happens inside the commit
    fsync_s = observed[0][1]
    commit_s = observed[1][1]
    assert 0 < fsync_s <= commit_s
    session.close()


def test_unwaited_commit_then_barrier(tmp_path: Path, observed: list[tuple[str, float]]) -> None:
    """The harness's pattern: ``commit(wait=False)`` writes (a commit, no fsync), the barrier
    syncs (one fsync covering both commits)."""
    session = open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path), durability="batch")
    observed.clear()
    session.commit([EntryOp(ent("a", None))], wait=False)
    session.commit([EntryOp(ent("b", "a"))], wait=False)
    assert _kinds(observed) == ["commit", "commit"]
    session.wait_durable()
    assert _kinds(observed) == ["commit", "commit", "fsync"]
    session.close()


def test_none_mode_reports_commits_only(tmp_path: Path, observed: list[tuple[str, float]]) -> None:
    session = open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path), durability="none")
    observed.clear()
    for i in range(3):
        session.commit([RecordOp(rec(f"r{i}"))])
    session.wait_durable()
    assert _kinds(observed) == ["commit"] * 3
    session.close()


def test_group_commit_reports_each_call_and_one_fsync(
    tmp_path: Path, observed: list[tuple[str, float]]
) -> None:
    session = open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path), durability="batch")
    observed.clear()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(session.commit_async, [RecordOp(rec(f"r{i}"))])

    anyio.run(main)
    assert sorted(_kinds(observed)) == ["commit"] * 4 + ["fsync"]
    session.close()


def test_no_observer_no_report(tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []
    remove = timing.add_observer(lambda what, s: seen.append((what, s)))
    remove()
    assert not timing.enabled()
    session = open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path), durability="sync")
    session.commit([RecordOp(rec("r1"))])
    session.close()
    assert seen == []
