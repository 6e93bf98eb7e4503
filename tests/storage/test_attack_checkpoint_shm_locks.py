"""The checkpointer's ``-shm`` descriptor against the process's SQLite locks.

:class:`~durable_harness.storage.sqlite.checkpoint.Checkpointer` once opened ``<db>-shm``
itself (to read the frame counts) and closed it in ``close()``; it no longer opens it. Closing any
descriptor of a file drops every POSIX lock the process holds on it
(https://www.sqlite.org/howtocorrupt.html, 2.2): the ``-shm`` locks of every other SQLite
connection of this process to the database too (another store object's sessions, a read-only
view, ``fsck``). Among them the "DMS" lock that tells another process's first connection that
the wal-index is in use (it would reset and rebuild it under us), the read marks that keep a
checkpoint from overwriting frames a reader still uses, and the WAL write lock.

Shown here with the DMS byte: while a session of a second store object is still open, no other
process may take it exclusively.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.storage import EntryOp, SqliteStore, open_store
from durable_harness.storage.sqlite import checkpoint

from .util import ent

pytestmark = [pytest.mark.timeout(60)]

DMS = 128  # UNIX_SHM_DMS: (22 + SQLITE_SHM_NLOCK) * 4 + SQLITE_SHM_NLOCK, one byte

PROBE = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]))
except OSError:
    print("held")
else:
    print("free")
"""


def _dms(db: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, f"{db}-shm", str(DMS)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


def test_closing_a_store_keeps_the_other_connections_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "WAL_CHECKPOINT_PAGES", 4)  # the thread runs at once
    monkeypatch.setattr(checkpoint, "FRAMES_PER_COMMIT", 2.0)
    db = tmp_path / "s.db"
    first = open_store(f"sqlite:{db}")
    second = open_store(f"sqlite:{db}")
    assert isinstance(first, SqliteStore) and isinstance(second, SqliteStore)
    a = first.create_session("/p")
    b = second.create_session("/p")
    for i in range(4):
        a.commit([EntryOp(ent(f"a{i}", None if i == 0 else f"a{i - 1}"), lane="main")])
    b.commit([EntryOp(ent("b0"), lane="main")])
    assert _dms(db) == "held"
    a.close()  # the first store's last session: its checkpointer closes
    assert _dms(db) == "held"  # the second store's connections are still open
    b.commit([EntryOp(ent("b1", "b0"), lane="main")])
    b.close()
