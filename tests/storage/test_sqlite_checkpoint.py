"""WAL checkpoints off the commit path (``storage/sqlite/checkpoint.py``, ``design/storage.md``
"Checkpoints"): the shared writer never checkpoints inside a COMMIT of its own accord, the
store's thread copies the WAL back once it holds the threshold's frames, the writer finishes
with the few frames written meanwhile, the WAL then starts again instead of growing, and
nothing committed is lost or damaged."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from durable_harness.storage import EntryOp, RecordOp, SqliteStore, open_store
from durable_harness.storage.sqlite import checkpoint

from .util import ent, ids, rec

pytestmark = [pytest.mark.timeout(120)]


def _salt(db: Path) -> bytes:
    """The WAL header's salt (https://www.sqlite.org/walformat.html): it changes each time the WAL
    starts again from its beginning. (Read from ``-wal``, which SQLite does not lock; this
    process must not open ``-shm`` or the database: closing any descriptor of a file drops
    SQLite's POSIX locks on it.)"""
    with open(db.parent / f"{db.name}-wal", "rb") as fh:
        return fh.read(24)[16:24]


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dh-checkpoint")]


def test_the_wal_is_copied_back_by_the_thread_and_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "WAL_CHECKPOINT_PAGES", 40)
    monkeypatch.setattr(checkpoint, "FRAMES_PER_COMMIT", 4.0)
    db = tmp_path / "s.db"
    store = open_store(f"sqlite:{db}")
    assert isinstance(store, SqliteStore)
    sessions = [store.create_session("/p", durability="batch") for _ in range(4)]
    shared = sessions[0]._shared  # type: ignore[attr-defined]
    assert shared.writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    try:
        salts = {_salt(db)} if (db.parent / f"{db.name}-wal").exists() else set()
        for i in range(150):
            for n, s in enumerate(sessions):
                parent = None if i == 0 else f"e{n}-{i - 1}"
                s.commit(
                    [
                        EntryOp(ent(f"e{n}-{i}", parent, text="x" * 900), lane="main"),
                        RecordOp(rec(f"r{n}-{i}")),
                    ],
                    wait=False,
                )
            salts.add(_salt(db))
        cp = shared.checkpointer
        assert cp is not None and cp.checkpoints >= 2 and cp.failures == 0
        # the WAL started again after checkpoints instead of holding every frame ever written
        assert cp.restarts >= 2 and len(salts) >= 3, (cp.restarts, len(salts))
        assert _threads()
    finally:
        for s in sessions:
            s.close()
    assert not _threads()  # the last close stops the thread
    again = open_store(f"sqlite:{db}")
    for n, s in enumerate(sessions):
        with again.open_session(s.session_id, write=False) as ro:
            assert ids(ro.iter_entries()) == [f"e{n}-{i}" for i in range(150)]
            assert len(ro.records()) == 150
            assert ro.damage == []


def test_no_thread_until_the_wal_needs_it(tmp_path: Path) -> None:
    store = open_store(f"sqlite:{tmp_path / 's.db'}")
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    assert not _threads()
    s.close()
