"""The SQLite page size (``design/storage.md``, "Page size"): a database the store creates gets
pages of ``connection.PAGE_SIZE`` bytes, a database made before keeps its own and stays fully
usable, and the smaller pages are what a durable commit is cheaper for: fewer WAL bytes."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from durable_harness.harness.records import record
from durable_harness.ids import new_id
from durable_harness.storage import EntryOp, RecordOp, SqliteStore
from durable_harness.storage.sqlite import connection


def _page_size(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA page_size").fetchone()[0])


def _turns(store: SqliteStore, cwd: str, turns: int) -> tuple[str, int]:
    """Commit ``turns`` turn-shaped commits (a message entry under the last, two records) to a
    new session; return its id and the WAL's size before it closes (the last close removes the
    WAL)."""
    session = store.create_session(cwd, durability="sync")
    try:
        parent = None
        for i in range(turns):
            entry = {
                "type": "message",
                "id": new_id(),
                "parentId": parent,
                "timestamp": "2026-12-08T00:00:00.000Z",
                "message": {"role": "user", "content": f"turn {i}: " + "x" * 300},
            }
            recs = [record("save_point", "main", None, turn=i) for _ in range(2)]
            session.commit([EntryOp(entry, lane="main"), *map(RecordOp, recs)])
            parent = entry["id"]
        return session.session_id, Path(f"{store.path}-wal").stat().st_size
    finally:
        session.close()


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
            "id": new_id(),
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
    """The WAL's size after the same commits on a fresh store (never checkpointed at this
    size), at SQLite's default and at ours: deterministic, unlike a sync's time."""
    sizes = {}
    for page in (4096, connection.PAGE_SIZE):
        db = tmp_path / f"p{page}.db"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(connection, "PAGE_SIZE", page)
            _, sizes[page] = _turns(SqliteStore(db), str(tmp_path), 60)
        assert _page_size(db) == page
    assert sizes[connection.PAGE_SIZE] < sizes[4096] * 0.6, sizes
