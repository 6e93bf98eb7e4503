"""Unwaited commits on PostgreSQL (``design/postgres.md``, "Unwaited commits"): sent on a held
connection in pipeline mode and answered later. What must hold: the call returns before the
server has run the commit; the writer reads its own commits; a SIGKILL right after the call
keeps what was sent; a refusal, a takeover or a lost connection surfaces at the next call with
nothing applied twice; a process whose pool has no room to hold a connection commits the waited
way."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from durable_harness.errors import IdConflict, StaleGeneration
from durable_harness.storage import EntryOp, RecordOp, open_store
from durable_harness.storage.postgres import PostgresSessionStore, PostgresStore
from durable_harness.storage.postgres.connection import Database

from .util import ent, ids, rec


@pytest.fixture
def pg_store(pg_spec: str) -> PostgresStore:
    store = open_store(pg_spec)
    assert isinstance(store, PostgresStore)
    return store


def _writer(store: PostgresStore) -> PostgresSessionStore:
    s = store.create_session("/p")
    assert isinstance(s, PostgresSessionStore)
    s.commit([EntryOp(ent("e1"), lane="main")])
    return s


def _closed_session(store: PostgresStore) -> str:
    """The id of a session :func:`_writer` made and closed (for a child process to open)."""
    s = _writer(store)
    s.close()
    return s.session_id


def _stored(spec: str, sid: str) -> list[str]:
    """The record ids stored for ``sid``, read on a connection of its own."""
    with psycopg.connect(spec, autocommit=True) as c:
        rows = c.execute(
            "SELECT id FROM records WHERE session_id = %s ORDER BY seq", (sid,)
        ).fetchall()
    return [r[0] for r in rows]


class LeaseLock:
    """A transaction holding the session's lease row ``FOR UPDATE``: a commit's fence (a shared
    lock on that row) waits until :meth:`release`."""

    def __init__(self, spec: str, sid: str) -> None:
        self.conn = psycopg.connect(spec)
        self.conn.execute("SELECT 1 FROM leases WHERE session_id = %s FOR UPDATE", (sid,))

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


@pytest.fixture
def lease_locks() -> Iterator[list[LeaseLock]]:
    made: list[LeaseLock] = []
    yield made
    for lock in made:
        lock.release()


def _in_thread(fn: Callable[[], Any], timeout: float = 15.0) -> Any:
    """``fn()`` on a thread; fail if it has not returned within ``timeout`` seconds."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{fn} did not return within {timeout} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _held_writer(
    store: PostgresStore, locks: list[LeaseLock]
) -> tuple[PostgresSessionStore, LeaseLock]:
    """A writer (one entry committed) whose next commits the server cannot finish until the
    returned lock is released."""
    s = _writer(store)
    lock = LeaseLock(store.spec, s.session_id)
    locks.append(lock)
    return s, lock


def _unwaited(s: PostgresSessionStore, *rids: str) -> None:
    """Commit one record per id without waiting; each call must return (on a thread, checked
    with a deadline) whatever the server is doing."""
    for rid in rids:
        _in_thread(lambda rid=rid: s.commit([RecordOp(rec(rid))], wait=False))


def test_an_unwaited_commit_returns_while_the_server_still_holds_it(
    pg_store: PostgresStore, lease_locks: list[LeaseLock]
) -> None:
    s, lock = _held_writer(pg_store, lease_locks)
    _unwaited(s, "u1")  # the server cannot finish it until the lock goes: no wait
    assert _stored(pg_store.spec, s.session_id) == []
    lock.release()
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["u1"]
    s.close()


def test_the_writer_reads_its_own_unwaited_commits(pg_store: PostgresStore) -> None:
    s = _writer(pg_store)
    s.commit([EntryOp(ent("e2", "e1"), lane="side"), RecordOp(rec("r1", lane="side"))], wait=False)
    s.commit([RecordOp(rec("r2"))], wait=False)
    # no barrier: every read goes through the replies first
    assert ids(s.records()) == ["r1", "r2"]
    assert ids(s.iter_entries()) == ["e1", "e2"] and s.entry_count() == 2
    assert s.last_seq() == 4 and s.lane("side").leaf_id == "e2"
    s.close()
    ro = pg_store.open_session(s.session_id, write=False)
    try:
        assert ro.lanes()["side"].leaf_id == "e2" and ro.damage == []
    finally:
        ro.close()


# A writer that commits two records without waiting and is SIGKILLed at once: reads SPEC and SID,
# says "ready", waits for a line, commits "a" and "b" (wait=False), says "sent", dies.
KILLED_WRITER = """
import os, signal, sys
from durable_harness.storage import RecordOp, open_store
s = open_store(sys.argv[1]).open_session(sys.argv[2], write=True)
print("ready", flush=True)
sys.stdin.readline()
for rid in ("a", "b"):
    s.commit([RecordOp({"type": "note", "id": rid, "lane": "main",
                        "timestamp": "2026-01-01T00:00:00.000Z"})], wait=False)
print("sent", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _kill_after_sending(script: str, spec: str, sid: str, between: Callable[[], Any]) -> None:
    """Run ``script`` in a child (it says "ready", waits for a line, commits without waiting,
    says "sent" and SIGKILLs itself) on ``spec``/``sid``; call ``between()`` after "ready";
    return once the child is dead."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, spec, sid],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        between()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "sent"
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait(timeout=30)


def _until_stored(spec: str, sid: str, want: list[str], timeout: float = 30.0) -> None:
    """Poll until the stored record ids of ``sid`` are ``want``; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while (got := _stored(spec, sid)) != want:
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def _killed_while_held(store: PostgresStore, lease_locks: list[LeaseLock]) -> str:
    """A session whose writer (a child, :data:`KILLED_WRITER`) sent "a" and "b" without waiting
    and was SIGKILLed while the server was held on a :class:`LeaseLock` (still held, last in
    ``lease_locks``) before running them: its id."""
    sid = _closed_session(store)
    _kill_after_sending(
        KILLED_WRITER, store.spec, sid, lambda: lease_locks.append(LeaseLock(store.spec, sid))
    )
    return sid


@pytest.mark.crash
def test_a_sigkill_right_after_unwaited_commits_keeps_them(
    pg_store: PostgresStore, lease_locks: list[LeaseLock]
) -> None:
    sid = _killed_while_held(pg_store, lease_locks)
    assert _stored(pg_store.spec, sid) == []
    lease_locks[-1].release()
    _until_stored(pg_store.spec, sid, ["a", "b"])
    ro = pg_store.open_session(sid, write=False)
    try:
        assert ids(ro.records()) == ["a", "b"] and ro.last_seq() == 3 and ro.damage == []
    finally:
        ro.close()


def test_a_refused_unwaited_commit_is_raised_by_the_next_call(pg_store: PostgresStore) -> None:
    s = _writer(pg_store)
    s.commit([RecordOp(rec("dup"))])
    s.commit([RecordOp(rec("dup"))], wait=False)  # returns: the refusal is not read yet
    with pytest.raises(IdConflict, match="dup"):
        s.commit([RecordOp(rec("after"))], wait=False)
        s.wait_durable()
    # the refused commit and the one sent behind it (its fence saw last_seq unmoved) are out
    assert ids(s.records()) == ["dup"] and s.last_seq() == 2
    s.commit([RecordOp(rec("next"))], wait=False)
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["dup", "next"]
    s.close()


def test_a_writer_fenced_out_with_a_commit_in_flight_gets_stale_generation(
    pg_store: PostgresStore,
) -> None:
    s = _writer(pg_store)
    s.commit([RecordOp(rec("mine"))], wait=False)
    s.wait_durable()
    other = pg_store.open_session(s.session_id, write=True, break_lease=True)
    try:
        s.commit([RecordOp(rec("late"))], wait=False)
        with pytest.raises(StaleGeneration):
            s.wait_durable()
        assert ids(other.records()) == ["mine"]
    finally:
        other.close()
        s.close()


def _kill_pipeline_backend(cluster: Any, spec: str, s: PostgresSessionStore) -> None:
    assert s._pipe is not None, "no commit in flight"
    pid = s._pipe.conn.info.backend_pid
    cluster.execute(f"SELECT pg_terminate_backend({pid})", spec)


def test_a_connection_lost_after_a_commit_landed_sends_only_the_rest(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    s = _writer(pg_store)
    s.commit([RecordOp(rec("a"))], wait=False)
    deadline = time.monotonic() + 30
    while _stored(pg_store.spec, s.session_id) != ["a"]:  # landed; its reply is unread
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _kill_pipeline_backend(pg_cluster, pg_store.spec, s)
    s.commit([RecordOp(rec("b"))], wait=False)
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["a", "b"]
    assert s.last_seq() == 3
    s.close()


def test_a_connection_lost_before_commits_landed_sends_them_again(
    pg_cluster: Any, pg_store: PostgresStore, lease_locks: list[LeaseLock]
) -> None:
    s, lock = _held_writer(pg_store, lease_locks)
    _unwaited(s, "a", "b")
    _kill_pipeline_backend(pg_cluster, pg_store.spec, s)  # both die with it, unapplied
    lock.release()
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["a", "b"]
    ro = pg_store.open_session(s.session_id, write=False)
    try:
        assert ro.last_seq() == 3 and ro.damage == []
    finally:
        ro.close()
    s.close()


def test_a_statement_the_connection_lost_is_prepared_again(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _writer(pg_store)
    real = Database.hold

    def forgetful(self: Database) -> Any:
        conn = real(self)
        if conn is not None:  # as after psycopg's DEALLOCATE ALL: we think it is prepared
            conn._dh_prepared = {"dh_write"}  # type: ignore[attr-defined]
        return conn

    monkeypatch.setattr(Database, "hold", forgetful)
    s.commit([RecordOp(rec("a"))], wait=False)
    s.commit([RecordOp(rec("b"))], wait=False)
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["a", "b"]
    s.close()


def test_large_unwaited_commits_do_not_stall_the_pipeline(pg_store: PostgresStore) -> None:
    s = _writer(pg_store)
    big = "x" * (4 << 20)
    for i in range(3):
        s.commit([RecordOp(rec(f"big{i}", text=big))], wait=False)
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["big0", "big1", "big2"]
    s.close()


@pytest.mark.parametrize("pool_max", [2, 3])
def test_a_pool_without_room_to_hold_commits_the_waited_way(
    pg_spec_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch, pool_max: int
) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_PG_POOL_MAX", str(pool_max))
    store = open_store(pg_spec_factory())
    assert isinstance(store, PostgresStore)
    sessions = [_writer(store) for _ in range(3)]
    for i in range(5):  # interleaved, as a host's sessions on one event loop
        for n, s in enumerate(sessions):
            _in_thread(lambda s=s, n=n, i=i: s.commit([RecordOp(rec(f"s{n}-{i}"))], wait=False))
    holding = [s for s in sessions if s._pipe is not None]
    assert len(holding) == pool_max - 2  # Database.HELD_SPARE stay free for everyone else
    for n, s in enumerate(sessions):
        s.wait_durable()
        assert _stored(store.spec, s.session_id) == [f"s{n}-{i}" for i in range(5)]
        s.close()


def test_a_third_commit_waits_for_the_first_reply(
    pg_store: PostgresStore, lease_locks: list[LeaseLock]
) -> None:
    # Two in flight is what a SIGKILL keeps: the server finishes the first unit and writes its
    # reply to the dead client, which succeeds, finishes the second and fails to write that
    # reply, and then gives up the connection before a third (design/postgres.md).
    s, lock = _held_writer(pg_store, lease_locks)
    _unwaited(s, "a", "b")
    third = threading.Thread(target=lambda: s.commit([RecordOp(rec("c"))], wait=False))
    third.start()
    third.join(0.5)
    assert third.is_alive(), "a third commit was sent with two unanswered"
    lock.release()
    third.join(15)
    assert not third.is_alive()
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["a", "b", "c"]
    s.close()


def test_a_third_commit_sent_when_the_connection_is_lost_is_not_dropped(
    pg_cluster: Any, pg_store: PostgresStore, lease_locks: list[LeaseLock]
) -> None:
    # The third commit first waits for the oldest reply; when that wait finds the connection
    # lost, the third was never sent, yet its call returned: it must still be sent (found by
    # the next call's resolution), never dropped.
    s = _writer(pg_store)
    lock = LeaseLock(pg_store.spec, s.session_id)
    lease_locks.append(lock)
    _in_thread(lambda: s.commit([RecordOp(rec("a"))], wait=False))
    _in_thread(lambda: s.commit([RecordOp(rec("b"))], wait=False))
    _kill_pipeline_backend(pg_cluster, pg_store.spec, s)  # both die with it, unapplied
    lock.release()
    third = _in_thread(lambda: s.commit([RecordOp(rec("c"))], wait=False))
    assert third == 4
    assert ids(s.records()) == ["a", "b", "c"]  # the next call resolves the lost connection
    assert s.last_seq() == 4
    s.close()


def test_a_barrier_after_commits_sent_into_a_lost_connection_resolves_them(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    # A commit sent on a connection the server has dropped returns (its fate is the next
    # call's to learn); the barrier is that next call: it resolves the loss, it does not fail.
    s = _writer(pg_store)
    s.commit([RecordOp(rec("a"))], wait=False)
    s.wait_durable()
    s.commit([RecordOp(rec("b"))], wait=False)
    s.wait_durable()  # the pipeline is given back; the next commit holds one again
    s.commit([RecordOp(rec("c"))], wait=False)
    _kill_pipeline_backend(pg_cluster, pg_store.spec, s)
    deadline = time.monotonic() + 30
    while True:  # until the server has closed the connection
        with psycopg.connect(pg_store.spec, autocommit=True) as c:
            pids = [r[0] for r in c.execute("SELECT pid FROM pg_stat_activity").fetchall()]
        assert s._pipe is not None
        if s._pipe.conn.info.backend_pid not in pids:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.commit([RecordOp(rec("d"))], wait=False)
    s.commit([RecordOp(rec("e"))], wait=False)
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["a", "b", "c", "d", "e"]
    s.close()


# A writer whose pool's connections died in a server restart between its commits: commits "a"
# and barriers (its pooled connections are now idle), says "ready", waits for a line (the
# server is restarted meanwhile), commits "b" without waiting, says "sent", dies.
WRITER_ACROSS_A_RESTART = """
import os, signal, sys
from durable_harness.storage import RecordOp, open_store
s = open_store(sys.argv[1]).open_session(sys.argv[2], write=True)
def note(rid):
    return RecordOp({"type": "note", "id": rid, "lane": "main",
                     "timestamp": "2026-01-01T00:00:00.000Z"})
s.commit([note("a")], wait=False)
s.wait_durable()
print("ready", flush=True)
sys.stdin.readline()
s.commit([note("b")], wait=False)
print("sent", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.crash
def test_an_unwaited_commit_after_a_server_restart_survives_a_sigkill(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    # The server was up for the whole commit call: the commit must not go out on a pooled
    # connection the restart closed (it would reach no server, and the SIGKILL would lose it).
    sid = _closed_session(pg_store)
    _kill_after_sending(WRITER_ACROSS_A_RESTART, pg_store.spec, sid, lambda: pg_cluster.restart())
    _until_stored(pg_store.spec, sid, ["a", "b"])


@pytest.mark.parametrize("wait", [True, False])
def test_a_nul_in_a_text_field_is_refused_before_anything_is_sent(
    pg_store: PostgresStore, wait: bool
) -> None:
    from durable_harness.errors import InvalidOp

    s = _writer(pg_store)
    with pytest.raises(InvalidOp, match="NUL"):
        s.commit([RecordOp(rec("r1", lane="ma\x00in"))], wait=wait)
    s.commit([RecordOp(rec("r2"))], wait=wait)  # the writer goes on
    s.wait_durable()
    assert _stored(pg_store.spec, s.session_id) == ["r2"]
    s.close()


# As WRITER_ACROSS_A_RESTART, but "a" is not followed by a barrier: the connection is still held
# (its reply unread) when the server restarts.
WRITER_HOLDING_ACROSS_A_RESTART = WRITER_ACROSS_A_RESTART.replace("s.wait_durable()\n", "")


@pytest.mark.crash
def test_an_unwaited_commit_after_a_restart_on_a_held_connection_survives_a_sigkill(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    # The held connection is read before the next commit goes out: a server's goodbye found
    # there gives it up, so "b" is not sent to a server that already closed it.
    sid = _closed_session(pg_store)
    _kill_after_sending(
        WRITER_HOLDING_ACROSS_A_RESTART, pg_store.spec, sid, lambda: pg_cluster.restart()
    )
    _until_stored(pg_store.spec, sid, ["a", "b"])


@pytest.mark.crash
def test_a_takeover_on_this_host_waits_for_the_dead_writers_commits(
    pg_store: PostgresStore, lease_locks: list[LeaseLock]
) -> None:
    # A writer sends "a" and "b" without waiting and is SIGKILLed while the server is held
    # before running them; a new writer here sees the holder dead and takes over at once. Had
    # it moved the generation first, the fence would refuse the two commits whose calls had
    # returned; it waits until the server has no backend of the dead process left.
    sid = _killed_while_held(pg_store, lease_locks)
    taken: list[Any] = []
    opener = threading.Thread(target=lambda: taken.append(pg_store.open_session(sid)))
    opener.start()
    time.sleep(0.5)
    assert not taken, "the takeover did not wait for the dead writer's commits"
    lease_locks[-1].release()
    opener.join(30)
    assert taken, "the takeover did not finish once the server ran them"
    new = taken[0]
    try:
        assert ids(new.records()) == ["a", "b"]
        new.commit([RecordOp(rec("c"))])
        assert _stored(pg_store.spec, sid) == ["a", "b", "c"]
    finally:
        new.close()
