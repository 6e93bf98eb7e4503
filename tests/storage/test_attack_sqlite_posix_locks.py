"""Acknowledged commits lost when two processes use one SQLite store (found while SIGKILLing
two writers during checkpoints; the checkpointer is not the cause).

``SqliteStore.__init__`` checks the database is readable with
``os.close(os.open(path, O_RDONLY))``. Closing any descriptor of a file drops every POSIX lock
the process holds on it, including the locks of SQLite connections already open in this
process (https://www.sqlite.org/howtocorrupt.html, 2.2). A second ``open_store`` of the same
database in a process whose sessions are open (a host opening a read-only view, ``fsck``, a
second store object) so leaves its writer without its lock on the database file; another
process that then closes a connection believes it is the last, checkpoints, and deletes the
WAL (and ``-shm``) under the writer; a third process writing then starts a new WAL, and the
writer's next commits go to the unlinked one (its WAL sync finds a ``-wal`` file, the new one,
and syncs that instead): acknowledged, then gone (and the database soon "malformed"). Fixed in
``SqliteStore.__init__`` (``os.access``), which makes this test pass.
(``Checkpointer.close`` closing its own ``-shm`` descriptor has the same hazard for the locks on
``-shm``.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.storage import open_store

pytestmark = [pytest.mark.timeout(120)]

WRITER = r"""
import sys
from durable_harness.storage import EntryOp, open_store
from durable_harness.testing.conformance import ent
spec = sys.argv[1]
s = open_store(spec).create_session("/p")
s.commit([EntryOp(ent("e1"), lane="main")])
open_store(spec)  # a second store object of the same database in this process
print(s.session_id, flush=True)
sys.stdin.readline()  # another process opens and closes the store meanwhile
s.commit([EntryOp(ent("e2", "e1"), lane="main")])  # sync: durable when it returns
print("acked", flush=True)
sys.stdin.readline()
"""

OTHER = r"""
import sys
from durable_harness.storage import EntryOp, open_store
from durable_harness.testing.conformance import ent
s = open_store(sys.argv[1]).create_session("/q")  # a writer of another session
s.commit([EntryOp(ent("q1"), lane="main")])
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_second_store_object_does_not_cost_acknowledged_commits(tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path / 's.db'}"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdin is not None
    sid = writer.stdout.readline().strip()
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER, spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdout is not None
    assert other.stdout.readline().strip() == "ready"
    writer.stdin.write("\n")
    writer.stdin.flush()
    assert writer.stdout.readline().strip() == "acked"
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)
    os.kill(other.pid, signal.SIGKILL)
    other.wait(timeout=30)
    with open_store(spec).open_session(sid, write=False) as ro:
        assert [e["id"] for e in ro.iter_entries()] == ["e1", "e2"]
        assert ro.last_seq() == 2
