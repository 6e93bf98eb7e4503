"""The prefilled WAL (``design/storage.md``, "The prefilled WAL"): once SQLite's frames come near
the end of the ``-wal`` file, the WAL sync writes zeros past it, under SQLite's write lock, so
the commits that follow overwrite blocks the file has and their ``fdatasync`` journals no new
size. Checked by the file's size (deterministic, unlike a sync's time): it moves at a few
commits, not at each; the zeros are never read as frames (every commit reads back, in this
process and after a SIGKILL); two processes writing one store do not prefill in turn without
end; a prefill that finds another connection writing does not wait for it."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import pytest

from durable_harness.storage import EntryOp, RecordOp, SqliteStore, open_store
from durable_harness.storage.barrier_trace import wal_commit_end
from durable_harness.storage.sqlite import database

from .util import ent, ids, rec

pytestmark = [pytest.mark.timeout(120)]


def _commit(session: object, i: int) -> None:
    session.commit(  # type: ignore[attr-defined]
        [
            EntryOp(ent(f"e{i}", None if i == 0 else f"e{i - 1}", text="x" * 600), lane="main"),
            RecordOp(rec(f"r{i}")),
        ]
    )


def test_a_synced_wal_grows_at_a_few_commits_not_at_each(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    wal = Path(f"{db}-wal")
    store = SqliteStore(db)
    sizes: list[int] = []
    with store.create_session("/p", durability="sync") as s:
        for i in range(300):
            _commit(s, i)
            sizes.append(wal.stat().st_size)
        end, _ = wal_commit_end(str(wal))
        # 300 commits of several frames each; the file grew at a handful of them
        grew = sum(1 for a, b in itertools.pairwise(sizes) if b != a)
        assert grew <= 12, (grew, sizes[::25])
        # the zeros lie past the last commit frame, within the bound of one prefill
        assert end < sizes[-1] <= end + database.WAL_PREFILL_MAX + database.WAL_PREFILL_MARGIN
        assert end > 300 * 2 * 1024  # the frames themselves were written
    with store.open_session(s.session_id, write=False) as ro:
        assert ids(ro.iter_entries()) == [f"e{i}" for i in range(300)]
        assert ro.damage == []


def test_none_mode_makes_no_sync_and_no_prefill(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with SqliteStore(db).create_session("/p", durability="none") as s:
        for i in range(50):
            _commit(s, i)
        assert Path(f"{db}-wal").stat().st_size == wal_commit_end(f"{db}-wal")[0]


WRITER = r"""
import os, sys
from durable_harness.storage import EntryOp, RecordOp, open_store
from durable_harness.testing.conformance import ent, rec
spec, n, tag, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = open_store(spec).create_session("/p", durability="sync")
print(s.session_id, flush=True)
for i in range(n):
    parent = None if i == 0 else f"{tag}{i - 1}"
    s.commit([EntryOp(ent(f"{tag}{i}", parent, text="y" * 600), lane="main"),
              RecordOp(rec(f"{tag}r{i}"))])
    if i == n // 2:
        open(ready, "w").close()
        if sys.argv[5] == "hold":
            os.kill(os.getpid(), 9)  # SIGKILL with the WAL prefilled and the session open
s.close()
"""


def _writer(spec: str, n: int, tag: str, ready: Path, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, spec, str(n), tag, str(ready), how],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_two_processes_writing_one_store_prefill_within_bounds(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    spec = f"sqlite:{db}"
    SqliteStore(db).create_session("/p").close()  # the database, made once
    keep = open_store(spec).create_session("/p")  # holds the WAL open between the writers' runs
    try:
        procs = [_writer(spec, 400, t, tmp_path / f"{t}.ready", "close") for t in ("a", "b")]
        sids = []
        for p in procs:
            out, _ = p.communicate(timeout=100)
            assert p.returncode == 0
            sids.append(out.split()[0])
        end, _ = wal_commit_end(f"{db}-wal")
        size = Path(f"{db}-wal").stat().st_size
        # each process prefills only where the current log's frames come near the end:
        # the file is never more than two prefills past the frames
        assert end <= size <= end + 2 * (database.WAL_PREFILL_MAX + database.WAL_PREFILL_MARGIN)
    finally:
        keep.close()
    store = open_store(spec)
    for sid, tag in zip(sids, ("a", "b"), strict=True):
        with store.open_session(sid, write=False) as ro:
            assert ids(ro.iter_entries()) == [f"{tag}{i}" for i in range(400)]
            assert ro.damage == []


def test_a_writer_sigkilled_with_a_prefilled_wal_loses_no_acknowledged_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"
    spec = f"sqlite:{db}"
    p = _writer(spec, 200, "k", tmp_path / "k.ready", "hold")
    out, _ = p.communicate(timeout=100)
    assert p.returncode == -signal.SIGKILL
    wal = Path(f"{db}-wal")
    assert wal.stat().st_size > wal_commit_end(str(wal))[0]  # zeros past the frames
    with open_store(spec).open_session(out.split()[0], write=False) as ro:
        assert ids(ro.iter_entries()) == [f"k{i}" for i in range(101)]
        assert len(ro.records()) == 101
        assert ro.damage == []


def test_a_prefill_does_not_wait_for_another_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "WAL_PREFILL_MARGIN", 1 << 40)  # every sync finds frames near
    db = tmp_path / "s.db"
    with SqliteStore(db).create_session("/p", durability="sync") as s:
        _commit(s, 0)
        shared = s._shared  # type: ignore[attr-defined]
        timeout = shared.writer.execute("PRAGMA busy_timeout").fetchone()[0]
        assert timeout > 0
        fd = os.open(f"{db}-wal", os.O_RDWR)
        try:
            with closing(sqlite3.connect(db, isolation_level=None)) as other:
                other.execute("BEGIN IMMEDIATE")  # another connection writing
                before = os.fstat(fd).st_size
                shared._prefill_wal(fd)  # returns at once (busy), writes nothing
                assert os.fstat(fd).st_size == before
                other.execute("ROLLBACK")
            assert not shared.writer.in_transaction
            assert shared.writer.execute("PRAGMA busy_timeout").fetchone()[0] == timeout
            shared._prefill_wal(fd)  # the database free: the zeros are written
            assert os.fstat(fd).st_size > before
        finally:
            os.close(fd)
        _commit(s, 1)  # and the writer goes on


def test_a_prefill_does_not_wait_for_the_writer_lock_another_thread_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread holding the writer's lock may itself be waiting for SQLite's (another process
    writing); a sync waiting behind it would acknowledge its commit that much later (an attack
    run measured 4.27 s against 0.002 s). The prefill is skipped instead: if it waited, this
    test would hang until its timeout, the lock being released only after the call."""
    monkeypatch.setattr(database, "WAL_PREFILL_MARGIN", 1 << 40)  # every sync finds frames near
    db = tmp_path / "s.db"
    with SqliteStore(db).create_session("/p", durability="sync") as s:
        _commit(s, 0)
        shared = s._shared  # type: ignore[attr-defined]
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with shared.lock:
                held.set()
                release.wait(60)

        holder = threading.Thread(target=hold)
        holder.start()
        fd = os.open(f"{db}-wal", os.O_RDWR)
        try:
            assert held.wait(10)
            before = os.fstat(fd).st_size
            shared._prefill_wal(fd)  # returns at once, writes nothing
            assert os.fstat(fd).st_size == before
        finally:
            release.set()
            holder.join()
            os.close(fd)
        _commit(s, 1)
