"""What a SQLite commit writes to the WAL (``design/storage.md``, "Ids and pages" and "Page
size"): increasing ids put a session's new rows on the pages the last commit wrote, so a commit
writes fewer pages than with random ids; a database the store creates gets pages of
``connection.PAGE_SIZE`` bytes, so the same commits write fewer WAL bytes; a database made before
keeps its own page size and stays fully usable. The WAL's frames are counted up to the end of its
last commit frame before the last close (which removes the WAL): deterministic, unlike a sync's
time."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from durable_harness import ids
from durable_harness.harness.records import record
from durable_harness.storage import EntryOp, RecordOp, SqliteStore
from durable_harness.storage.barrier_trace import wal_commit_end
from durable_harness.storage.sqlite import connection


def _page_size(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA page_size").fetchone()[0])


def _turns(
    store: SqliteStore, cwd: str, turns: int, make_id: Callable[[], str] = ids.new_id
) -> tuple[str, int]:
    """Commit ``turns`` turn-shaped commits (a message entry under the last, two records; ids
    from ``make_id``) to a new session; return its id and the WAL's bytes then, to the end of
    its last commit frame (a synced WAL may hold zeros past it: ``design/storage.md``, "The
    prefilled WAL")."""
    session = store.create_session(cwd, durability="none")
    try:
        parent = None
        for i in range(turns):
            entry = {
                "type": "message",
                "id": make_id(),
                "parentId": parent,
                "timestamp": "2026-12-08T00:00:00.000Z",
                "message": {"role": "user", "content": f"turn {i}: " + "x" * 300},
            }
            recs = [record("save_point", "main", None, turn=i) for _ in range(2)]
            for rec in recs:
                rec["id"] = make_id()
            session.commit([EntryOp(entry, lane="main"), *map(RecordOp, recs)])
            parent = entry["id"]
        return session.session_id, wal_commit_end(f"{store.path}-wal")[0]
    finally:
        session.close()


def _pages_per_commit(path: Path, make_id: Callable[[], str], commits: int = 150) -> float:
    _, wal = _turns(SqliteStore(path), str(path.parent), commits, make_id)
    return (wal - 32) / (_page_size(path) + 24) / commits  # a header, then header + page each


def test_increasing_ids_make_a_sqlite_commit_write_fewer_pages(tmp_path: Path) -> None:
    rng = random.Random(7)
    scattered = _pages_per_commit(tmp_path / "random.db", lambda: f"{rng.getrandbits(64):016x}")
    ours = _pages_per_commit(tmp_path / "ours.db", ids.new_id)
    assert ours < scattered * 0.9, (ours, scattered)


def test_a_new_store_gets_the_page_size(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    SqliteStore(db).create_session(str(tmp_path)).close()
    assert _page_size(db) == connection.PAGE_SIZE == 1024


def test_a_store_made_with_4k_pages_keeps_them_and_works(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with pytest.MonkeyPatch.context() as mp:  # a store made before the change
        mp.setattr(connection, "PAGE_SIZE", 4096)
        sid, _ = _turns(SqliteStore(db), str(tmp_path), 3)
    assert _page_size(db) == 4096
    store = SqliteStore(db)  # opened by this version: it writes, reads and keeps 4 KiB pages
    with store.open_session(sid) as session:
        before = session.entry_count()
        entry = {
            "type": "message",
            "id": ids.new_id(),
            "parentId": session.lane("main").leaf_id,
            "timestamp": "2026-12-08T00:00:01.000Z",
            "message": {"role": "user", "content": "after the upgrade"},
        }
        session.commit([EntryOp(entry, lane="main")])
        assert session.entry_count() == before + 1
    second, _ = _turns(store, str(tmp_path), 2)
    with SqliteStore(db).open_session(second, write=False) as session:
        assert session.entry_count() == 2
    assert _page_size(db) == 4096


def test_smaller_pages_write_fewer_wal_bytes_per_commit(tmp_path: Path) -> None:
    """The same commits on fresh stores at SQLite's default page size and at ours."""
    sizes = {}
    for page in (4096, connection.PAGE_SIZE):
        db = tmp_path / f"p{page}.db"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(connection, "PAGE_SIZE", page)
            _, sizes[page] = _turns(SqliteStore(db), str(tmp_path), 60)
        assert _page_size(db) == page
    assert sizes[connection.PAGE_SIZE] < sizes[4096] * 0.6, sizes


def _cwd_index(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as db:
        return [r[2] for r in db.execute("PRAGMA index_info(sessions_cwd)")]


def test_a_commit_writes_no_page_of_the_cwd_index(tmp_path: Path) -> None:
    """Every commit moves the session row's ``modified``; the cwd index leaves it out (migration
    3), so the commit writes no page of it: about one WAL page less a commit than a store made
    at migration 2, which this version migrates on its first writable open, listings unchanged."""
    old_db = tmp_path / "m2.db"
    with pytest.MonkeyPatch.context() as mp:  # a store made before migration 3
        mp.setattr(connection, "MIGRATIONS", connection.MIGRATIONS[:2])
        old = _pages_per_commit(old_db, ids.new_id, commits=60)
        sid, _ = _turns(SqliteStore(old_db), "/elsewhere", 1)
    assert _cwd_index(old_db) == ["cwd", "modified"]
    new = _pages_per_commit(tmp_path / "m3.db", ids.new_id, commits=60)
    assert _cwd_index(tmp_path / "m3.db") == ["cwd"]
    assert new <= old - 0.8, (new, old)
    store = SqliteStore(old_db)
    store.create_session("/elsewhere").close()  # a writable open migrates
    assert _cwd_index(old_db) == ["cwd"]
    mine = store.list_sessions("/elsewhere")
    assert len(mine) == 2 and sid in {info.id for info in mine}
    assert [i.modified for i in mine] == sorted((i.modified for i in mine), reverse=True)
    assert len(store.list_sessions()) == 3
