"""WAL checkpoints off the commit path against real crashes: two processes write one SQLite
database (each with its own checkpointer, thresholds made tiny so checkpoints, the writer's
finishing checkpoints and WAL restarts happen all the time, a reader thread holding snapshots
meanwhile) and are SIGKILLed at random moments, several rounds on the same database. Every
commit a writer acknowledged (a ``sync`` commit returned) must read back, in order, with no
damage (``design/storage.md`` "Checkpoints")."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable_harness.crashtest import forkserver
from durable_harness.storage import SqliteStore, open_store

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

WRITER = r"""
import sys, threading
from durable_harness.storage import EntryOp, RecordOp, open_store
from durable_harness.storage.sqlite import checkpoint
from durable_harness.testing.conformance import ent, rec
checkpoint.WAL_CHECKPOINT_PAGES = 30
checkpoint.CHECK_EVERY = 2
checkpoint.LEFT_FOR_WRITER = 5
spec, sid, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(spec)
s = store.open_session(sid, write=True, durability="sync")
def hold_snapshots():
    ro = open_store(spec).open_session(sid, write=False)
    conn = ro._shared.reader
    while True:
        with ro._shared.read_lock:
            conn.execute("BEGIN")
            conn.execute("SELECT COUNT(*) FROM entries").fetchone()
        threading.Event().wait(0.005)
        with ro._shared.read_lock:
            conn.execute("ROLLBACK")
threading.Thread(target=hold_snapshots, daemon=True).start()
i = start
while True:
    parent = None if i == 0 else f"{sid}-{i - 1}"
    s.commit([EntryOp(ent(f"{sid}-{i}", parent, text="x" * 2500), lane="main"),
              RecordOp(rec(f"r{sid}-{i}"))])
    print(i, flush=True)
    i += 1
"""


def test_sigkill_during_checkpoints_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    spec = f"sqlite:{db}"
    store = open_store(spec)
    assert isinstance(store, SqliteStore)
    sids = []
    for _ in range(2):
        s = store.create_session("/p")
        sids.append(s.session_id)
        s.close()
    acked = {sid: -1 for sid in sids}
    rng = random.Random(7)
    for _round in range(4):
        procs = {
            sid: subprocess.Popen(
                [sys.executable, "-c", WRITER, spec, sid, str(acked[sid] + 1)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for sid in sids
        }
        time.sleep(rng.uniform(1.0, 2.5))
        for p in procs.values():
            os.kill(p.pid, signal.SIGKILL)
        for sid, p in procs.items():
            out, _ = p.communicate(timeout=30)
            lines = out.split()
            if lines:
                acked[sid] = int(lines[-1])
        for sid in sids:
            with open_store(spec).open_session(sid, write=False) as ro:
                got = [str(e["id"]) for e in ro.iter_entries()]
                want = [f"{sid}-{i}" for i in range(acked[sid] + 1)]
                assert got[: len(want)] == want
                assert len(got) <= len(want) + 1  # at most the commit cut short by the kill
                assert ro.damage == []
                acked[sid] = len(got) - 1  # the next writer goes on after what is there
    assert all(n > 20 for n in acked.values()), acked
    result = forkserver.run_cli(
        ["fsck", f"{spec}#{sids[0]}", "--json"], env=dict(os.environ), cwd=os.getcwd(), timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
