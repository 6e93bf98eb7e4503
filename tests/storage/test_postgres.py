"""The PostgreSQL backend beyond the shared contract (``design/postgres.md``): specs and the
error boundary, versioned migrations (``durable-harness migrate``), leases and fencing with
real processes (refused second writer, expiry and takeover, SIGKILL, SIGSTOP past the lease),
deletion, a restarted server and a connection lost mid-commit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from durable_harness.cli.main import main
from durable_harness.errors import (
    FormatError,
    LeaseHeld,
    SessionNotFound,
    StaleGeneration,
    StorageError,
    StorageIOError,
    StoreNotFound,
)
from durable_harness.storage import EntryOp, LaneOp, RecordOp, open_store
from durable_harness.storage.postgres import (
    MIGRATIONS,
    PostgresSessionStore,
    PostgresStore,
    unwaited,
)

from .util import ent, ids, rec

# A writer in its own process: opens SID of SPEC for writing (lease duration from
# $DURABLE_HARNESS_PG_LEASE_S), says "ready GEN", then for each stdin line "commit ID" commits
# one record and answers "ok SEQ" or "err CODE".
WORKER = """
import sys
from durable_harness.errors import DurableHarnessError
from durable_harness.storage import RecordOp, open_store
s = open_store(sys.argv[1]).open_session(sys.argv[2], write=True)
print(f"ready {s.generation}", flush=True)
for line in sys.stdin:
    rid = line.split()[1]
    try:
        seq = s.commit([RecordOp({"type": "note", "id": rid, "lane": "main",
                                  "timestamp": "2026-01-01T00:00:00.000Z"})])
        print(f"ok {seq}", flush=True)
    except DurableHarnessError as exc:
        print(f"err {exc.code}", flush=True)
"""


def _poll(fn: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """``fn()`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


class Worker:
    """A :data:`WORKER` child process."""

    def __init__(self, spec: str, sid: str, lease_s: float) -> None:
        env = {**os.environ, "DURABLE_HARNESS_PG_LEASE_S": str(lease_s)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, spec, sid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self._line()
        assert line.startswith("ready "), line + self._stderr()
        self.generation = int(line.split()[1])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def commit(self, rid: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"commit {rid}\n")
        self.proc.stdin.flush()
        return self._line()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Child writers started by a test; killed at its end."""
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


@pytest.fixture
def pg_store(pg_spec: str) -> PostgresStore:
    store = open_store(pg_spec)
    assert isinstance(store, PostgresStore)
    return store


def _expire(cluster: Any, spec: str, sid: str) -> None:
    """Move the session's lease expiry into the past on the database's clock."""
    cluster.execute(
        "UPDATE leases SET expires = clock_timestamp() - interval '1 second' "
        f"WHERE session_id = '{sid}'",
        spec,
    )


# -- the fixture's rule: skip locally, fail under CI ------------------------------------------
def test_a_missing_server_skips_locally_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_harness.testing.pgcluster import missing_postgres

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="PostgreSQL server binaries"):
        missing_postgres("PostgreSQL server binaries (initdb, pg_ctl) not found")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but PostgreSQL"):
        missing_postgres("PostgreSQL server binaries (initdb, pg_ctl) not found")


def test_the_server_binaries_are_found_off_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_harness.testing import pgcluster

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(pgcluster.glob, "glob", lambda pattern: [])
    assert pgcluster.find_bindir() is None
    monkeypatch.undo()
    found = pgcluster.find_bindir()
    if found is not None:  # this machine has a server: both initdb and pg_ctl are there
        assert os.access(os.path.join(found, "initdb"), os.X_OK)


# -- specs, errors, migrations ----------------------------------------------------------------
def test_both_url_schemes_open_the_same_store(pg_spec: str) -> None:
    a = open_store(pg_spec)
    s = a.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    s.close()
    other = open_store("postgres://" + pg_spec[len("postgresql://") :])
    assert isinstance(other, PostgresStore)
    assert [i.id for i in other.list_sessions("/p")] == [s.session_id]
    assert a.location == pg_spec  # no password in it: the location is the URL
    assert s.location == f"{a.location}#{s.session_id}"
    from durable_harness.testing import open_reader

    reader = open_reader(s.location)  # a second view from the location alone
    try:
        assert ids(reader.iter_entries()) == ["e1"] and reader.read_only
    finally:
        reader.close()


def test_an_unreachable_server_is_a_storage_error_without_the_password() -> None:
    """Needs psycopg only, no server: nothing listens on the port."""
    from durable_harness.testing.pgcluster import free_port

    spec = f"postgresql://agent:hunter2-secret@127.0.0.1:{free_port()}/agents?connect_timeout=5"
    with pytest.raises(StorageIOError) as info:
        open_store(spec)
    text = json.dumps(info.value.to_json())
    assert "hunter2" not in text
    assert f"postgresql://agent@127.0.0.1:{spec.split(':')[3].split('/')[0]}/agents" in text
    assert "refused" in text.lower()
    with pytest.raises(FormatError) as bad:
        open_store("postgresql://agent:hunter2-secret@127.0.0.1:notaport/x")
    assert "hunter2" not in str(bad.value)


def test_migrations_are_versioned_and_applied_once(pg_cluster: Any, pg_spec: str) -> None:
    with pytest.raises(StoreNotFound, match="holds no durable-harness tables"):
        open_store(pg_spec, create=False)
    assert pg_cluster.execute("SELECT to_regclass('sessions')", pg_spec) == [(None,)]
    assert main(["migrate", "--store", pg_spec, "--json"]) == 0
    rows = pg_cluster.execute("SELECT version FROM migrations ORDER BY version", pg_spec)
    assert rows == [(v,) for v in range(1, len(MIGRATIONS) + 1)]
    assert main(["migrate", "--store", pg_spec]) == 0  # nothing left to apply
    assert pg_cluster.execute("SELECT count(*) FROM migrations", pg_spec) == [(len(MIGRATIONS),)]
    assert open_store(pg_spec, create=False).list_sessions() == []


def test_processes_starting_together_migrate_once(pg_cluster: Any, pg_spec: str) -> None:
    script = (
        "import sys, time\n"
        "from durable_harness.storage import open_store\n"
        "t = float(sys.argv[2])\n"
        "while time.time() < t: time.sleep(0.005)\n"
        "open_store(sys.argv[1]).list_sessions()\n"
    )
    start = str(time.time() + 2.0)
    procs = [
        subprocess.Popen([sys.executable, "-c", script, pg_spec, start], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errs
    rows = pg_cluster.execute("SELECT version FROM migrations ORDER BY version", pg_spec)
    assert rows == [(v,) for v in range(1, len(MIGRATIONS) + 1)]


def test_migrate_prints_what_it_applied(pg_spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--store", pg_spec, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["applied"] == list(range(1, len(MIGRATIONS) + 1))
    assert got["version"] == len(MIGRATIONS)
    assert main(["migrate", "--store", pg_spec]) == 0
    assert "up to date (schema version" in capsys.readouterr().out


def test_a_newer_schema_is_refused(pg_cluster: Any, pg_spec_factory: Callable[[], str]) -> None:
    spec = pg_spec_factory()
    open_store(spec)
    pg_cluster.execute(f"INSERT INTO migrations VALUES ({len(MIGRATIONS) + 1}, 'later')", spec)
    from durable_harness.storage.postgres.connection import Database

    Database.forget(spec)  # a new process would see it on its first open
    with pytest.raises(StorageError, match="newer than this durable-harness knows"):
        open_store(spec)


def test_cli_lists_and_checks_a_postgres_store(
    pg_store: PostgresStore, capsys: pytest.CaptureFixture[str]
) -> None:
    s = pg_store.create_session("/proj")
    s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1"))])
    s.close()
    assert main(["sessions", "--json", "--store", pg_store.spec]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["id"] for row in listed] == [s.session_id]
    assert main(["fsck", s.session_id[:13], "--json", "--store", pg_store.spec]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["ok"], report["entries"], report["records"]) == (True, 1, 1)
    assert report["format"] == "postgres"
    assert main(["fsck", pg_store.spec, "--json"]) == 0  # the whole store, by its URL
    whole = json.loads(capsys.readouterr().out)
    assert (whole["ok"], whole["sessions"], whole["path"]) == (True, 1, pg_store.location)


def test_a_deleted_row_is_reported_as_a_gap(pg_cluster: Any, pg_store: PostgresStore) -> None:
    s = pg_store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    s.commit([RecordOp(rec("r1"))])
    s.commit([RecordOp(rec("r2"))])
    s.close()
    pg_cluster.execute("DELETE FROM records WHERE id = 'r1'", pg_store.spec)
    ro = pg_store.open_session(s.session_id, write=False)
    try:
        kinds = [(d["kind"], d.get("seq")) for d in ro.damage]
        assert kinds == [("seq_gap", 3)]
    finally:
        ro.close()


# -- leases and fencing -----------------------------------------------------------------------
def test_a_second_writer_is_refused_while_the_lease_is_live(
    pg_store: PostgresStore, workers: list[Worker]
) -> None:
    s = pg_store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    with pytest.raises(LeaseHeld) as info:
        pg_store.open_session(s.session_id)
    assert info.value.details["holder_pid"] == os.getpid()
    holder = s.lease_holder()
    assert holder is not None and holder["self"] and holder["generation"] == s.generation
    s.close()
    w = Worker(pg_store.spec, s.session_id, lease_s=30)
    workers.append(w)
    assert w.generation == s.generation + 1
    with pytest.raises(LeaseHeld) as info:
        pg_store.open_session(s.session_id)
    assert info.value.details["holder_pid"] == w.proc.pid
    ro = pg_store.open_session(s.session_id, write=False)
    try:
        held = ro.lease_holder()
        assert held is not None and held["pid"] == w.proc.pid and not held["self"]
        assert w.commit("from-worker") == "ok 2"
        assert ids(ro.records()) == ["from-worker"]
    finally:
        ro.close()


def test_the_heartbeat_keeps_a_short_lease_alive(pg_cluster: Any, pg_spec: str) -> None:
    store = PostgresStore(pg_spec, lease_s=0.6)
    s = store.create_session("/p")
    first = pg_cluster.execute(
        f"SELECT expires FROM leases WHERE session_id = '{s.session_id}'", pg_spec
    )[0][0]
    later = _poll(
        lambda: pg_cluster.execute(
            f"SELECT expires FROM leases WHERE session_id = '{s.session_id}' "
            f"AND expires > '{first.isoformat()}'::timestamptz + interval '1 second'",
            pg_spec,
        ),
        "the heartbeat to renew the lease past two of its durations",
    )
    assert later
    with pytest.raises(LeaseHeld):
        store.open_session(s.session_id)
    assert s.commit([RecordOp(rec("r1"))]) == 1
    s.close()
    assert store.open_session(s.session_id, write=False).lease_holder() is None


def test_an_expired_lease_is_taken_over_and_fences_the_old_owner(
    pg_cluster: Any, pg_spec: str
) -> None:
    store = PostgresStore(pg_spec, lease_s=600)  # its heartbeat will not beat during the test
    old = store.create_session("/p")
    old.commit([EntryOp(ent("e1"), lane="main")])

    def take_over() -> PostgresSessionStore | None:
        _expire(pg_cluster, pg_spec, old.session_id)
        try:
            got = store.open_session(old.session_id)
        except LeaseHeld:
            return None
        assert isinstance(got, PostgresSessionStore)
        return got

    new = _poll(take_over, "the expired lease to be taken over")
    assert new.generation == old.generation + 1
    with pytest.raises(StaleGeneration) as info:
        old.commit([EntryOp(ent("late", "e1"), lane="main")])
    assert info.value.details == {"generation": old.generation, "current": new.generation}
    assert new.commit([EntryOp(ent("e2", "e1"), lane="main")]) == 2
    old.close()  # the old owner's release must not free the new owner's lease
    assert new.lease_holder() is not None
    assert ids(new.iter_entries()) == ["e1", "e2"]
    new.close()


def test_break_lease_takes_a_live_lease_and_fences_its_holder(pg_store: PostgresStore) -> None:
    a = pg_store.create_session("/p")
    b = pg_store.open_session(a.session_id, break_lease=True)
    assert b.generation == a.generation + 1
    holder = b.lease_holder()
    assert holder is not None and holder["broken"] and holder["self"]
    with pytest.raises(StaleGeneration):
        a.commit([RecordOp(rec("r1"))])
    assert b.commit([RecordOp(rec("r1"))]) == 1
    a.close()
    b.close()


@pytest.mark.crash
def test_a_sigkilled_writer_on_this_host_is_taken_over_at_once(
    pg_store: PostgresStore, workers: list[Worker]
) -> None:
    s = pg_store.create_session("/p")
    s.close()
    w = Worker(pg_store.spec, s.session_id, lease_s=600)
    workers.append(w)
    assert w.commit("before-kill") == "ok 1"
    with pytest.raises(LeaseHeld):
        pg_store.open_session(s.session_id)
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait(timeout=30)
    # its lease has ten minutes left, but its process is gone from this host: as with a flock
    assert pg_store.open_session(s.session_id, write=False).lease_holder() is None
    new = pg_store.open_session(s.session_id)
    try:
        assert new.generation == w.generation + 1
        assert ids(new.records()) == ["before-kill"]
        assert new.commit([RecordOp(rec("after"))]) == 2
    finally:
        new.close()


@pytest.mark.crash
def test_a_sigkilled_writer_elsewhere_is_taken_over_when_its_lease_expires(
    pg_cluster: Any, pg_store: PostgresStore, workers: list[Worker]
) -> None:
    s = pg_store.create_session("/p")
    s.close()
    w = Worker(pg_store.spec, s.session_id, lease_s=1.0)
    workers.append(w)
    assert w.commit("before-kill") == "ok 1"
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait(timeout=30)
    # as if it had run on another machine: its death cannot be seen from here, only its silence
    pg_cluster.execute(
        "UPDATE leases SET host = 'elsewhere', owner = 'elsewhere:' || pid || ':1:feed', "
        "expires = clock_timestamp() + interval '1 second' "
        f"WHERE session_id = '{s.session_id}'",
        pg_store.spec,
    )
    with pytest.raises(LeaseHeld, match="elsewhere"):
        pg_store.open_session(s.session_id)

    def try_open() -> Any:
        try:
            return pg_store.open_session(s.session_id)
        except LeaseHeld:
            return None

    new = _poll(try_open, "the killed writer's lease to expire")
    try:
        assert new.generation == w.generation + 1
        assert ids(new.records()) == ["before-kill"]
        assert new.commit([RecordOp(rec("after"))]) == 2
    finally:
        new.close()


@pytest.mark.crash
def test_a_writer_paused_past_its_lease_finds_its_commits_refused(
    pg_store: PostgresStore, workers: list[Worker]
) -> None:
    s = pg_store.create_session("/p")
    s.close()
    w = Worker(pg_store.spec, s.session_id, lease_s=1.0)
    workers.append(w)
    assert w.commit("r1") == "ok 1"
    os.kill(w.proc.pid, signal.SIGSTOP)
    try:

        def try_open() -> Any:
            try:
                return pg_store.open_session(s.session_id)
            except LeaseHeld:
                return None

        new = _poll(try_open, "the paused writer's lease to expire")
        assert new.commit([RecordOp(rec("r2"))]) == 2
    finally:
        os.kill(w.proc.pid, signal.SIGCONT)
    assert w.commit("r3-late") == "err stale_generation"
    assert new.lease_holder() is not None  # the old owner's heartbeat did not take it back
    assert ids(new.records()) == ["r1", "r2"]
    new.close()


def test_delete_session_refuses_a_live_lease(pg_store: PostgresStore) -> None:
    s = pg_store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1"))])
    s.commit([EntryOp(ent("e2", "e1"), lane="main")])
    with pytest.raises(LeaseHeld):
        pg_store.delete_session(s.session_id)
    s.close()
    pg_store.delete_session(s.session_id)
    assert pg_store.list_sessions() == []
    with pytest.raises(SessionNotFound):
        pg_store.delete_session(s.session_id)


# -- the server restarts, the connection drops -------------------------------------------------
@pytest.mark.timeout(120)
def test_commits_go_on_after_the_server_restarts(pg_cluster: Any, pg_store: PostgresStore) -> None:
    s = pg_store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    pg_cluster.restart("immediate")  # a crash: the server replays its WAL
    assert ids(s.iter_entries()) == ["e1"]  # the pooled connection was dead: read retried
    assert s.commit([EntryOp(ent("e2", "e1"), lane="main")]) == 2
    s.close()
    again = open_store(pg_store.spec).open_session(s.session_id, write=False)
    assert ids(again.iter_entries()) == ["e1", "e2"]
    again.close()


def test_the_pool_gives_up_a_reconnect_chain_quickly_so_a_request_starts_another() -> None:
    # psycopg_pool's default (300 s of doubling pauses, no other attempt meanwhile) reached a
    # server back from a 15 s outage 20-27 s later (issue 22; design/postgres.md)
    from durable_harness.storage.postgres import connection

    db = connection.Database("postgresql://nobody@127.0.0.1:1/nothing")  # never connects
    assert db.pool.reconnect_timeout == connection.RECONNECT_CHAIN_S <= 1.0
    assert connection.GETCONN_SLICE_S < connection.CONNECT_TIMEOUT_S


@pytest.mark.timeout(180)
def test_the_pool_reaches_the_server_again_after_an_outage(
    pg_cluster: Any, pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_harness.storage.postgres import connection

    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_S", 2)  # a failed request in 2 s, not 10
    s = pg_store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    pg_cluster.stop()
    try:
        with pytest.raises(psycopg.OperationalError):  # the attempts fail while it is away
            pg_store.db.run(lambda c: c.execute("SELECT 1").fetchone())
    finally:
        pg_cluster.start()
    # back: the pool reconnects by itself (a request waits on it, within a generous limit)
    row = pg_store.db.run_until(lambda c: c.execute("SELECT 1").fetchone(), time.monotonic() + 120)
    assert row == (1,)
    assert s.commit([EntryOp(ent("e2", "e1"), lane="main")]) == 2
    s.close()


def _kill_backend(cluster: Any, spec: str, conn: psycopg.Connection[Any]) -> None:
    cluster.execute(f"SELECT pg_terminate_backend({conn.info.backend_pid})", spec)


def test_a_connection_lost_before_commit_is_committed_again(
    pg_cluster: Any, pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = pg_store.create_session("/p")
    assert isinstance(s, PostgresSessionStore)
    s.commit([EntryOp(ent("e1"), lane="main")])
    real = PostgresSessionStore._send
    calls = []

    def dropping(self: Any, conn: psycopg.Connection[Any], ops: Any, seq: int) -> None:
        calls.append(seq)
        if len(calls) == 1:  # the network drops just before the first attempt is sent
            _kill_backend(pg_cluster, pg_store.spec, conn)
        real(self, conn, ops, seq)

    monkeypatch.setattr(PostgresSessionStore, "_send", dropping)
    assert s.commit([EntryOp(ent("e2", "e1"), lane="main"), RecordOp(rec("r1"))]) == 3
    assert calls == [1, 1]
    assert ids(s.iter_entries()) == ["e1", "e2"] and ids(s.records()) == ["r1"]
    s.close()


def test_a_commit_whose_reply_was_lost_is_not_applied_twice(
    pg_cluster: Any, pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = pg_store.create_session("/p")
    assert isinstance(s, PostgresSessionStore)
    real = PostgresSessionStore._transaction
    calls = []

    def landed_then_lost(self: Any, conn: psycopg.Connection[Any], batch: Any) -> None:
        real(self, conn, batch)  # COMMIT reached the server...
        calls.append(1)
        if len(calls) == 1:  # ...and the reply never came back
            for item in batch:
                item.done = False
            _kill_backend(pg_cluster, pg_store.spec, conn)
            conn.execute("SELECT 1")  # raises OperationalError: the connection is broken

    monkeypatch.setattr(PostgresSessionStore, "_transaction", landed_then_lost)
    assert s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1"))]) == 2
    assert calls == [1]  # resolved by reading last_seq, not run again
    assert ids(s.iter_entries()) == ["e1"] and s.last_seq() == 2
    s.close()


# -- worker claims ------------------------------------------------------------------------------
# A claiming worker: claims up to 3 crashed sessions at a time until none is left, commits one
# record into each ("claimed-by-PID"), prints each claimed id, then "done".
CLAIMER = """
import os, sys
from durable_harness.storage import RecordOp, open_store
store = open_store(sys.argv[1])
while True:
    got = store.claim_expired(3)
    if not got:
        break
    for s in got:
        s.commit([RecordOp({"type": "note", "id": f"claimed-by-{os.getpid()}", "lane": "main",
                            "timestamp": "2026-01-01T00:00:00.000Z"})])
        print(s.session_id, s.generation, flush=True)
        s.close()
print("done", flush=True)
"""


@pytest.mark.crash
def test_two_workers_claim_ten_crashed_sessions_each_exactly_once(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    sids = []
    for _ in range(10):
        s = pg_store.create_session("/p")
        s.commit([RecordOp(rec("before-crash"))])
        sids.append(s.session_id)
        s.lease = None  # "crash": the lease is left held, as a killed process leaves it
        s.close()
    closed = pg_store.create_session("/p")
    closed.close()  # a cleanly closed session is not a crashed one: never claimed
    # the crashed holders ran elsewhere, and their leases ran out
    pg_cluster.execute(
        "UPDATE leases SET host = 'elsewhere', owner = 'elsewhere:1:1:dead', "
        "expires = clock_timestamp() - interval '1 second' WHERE owner IS NOT NULL",
        pg_store.spec,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, pg_store.spec], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0].split("\n") for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    claimed = {
        proc.pid: [line.split()[0] for line in out if line and line != "done"]
        for proc, out in zip(procs, outs, strict=True)
    }
    every = [sid for got in claimed.values() for sid in got]
    assert sorted(every) == sorted(sids)  # each crashed session exactly once, none other
    for pid, got in claimed.items():
        for sid in got:
            ro = pg_store.open_session(sid, write=False)
            try:
                assert ids(ro.records()) == ["before-crash", f"claimed-by-{pid}"]
                assert ro.lease_holder() is None  # released by the claimer's close
            finally:
                ro.close()
    assert pg_store.claim_expired() == []


# -- the writer's commit path -------------------------------------------------------------------
def test_unwaited_commits_wait_for_the_flush_on_the_server_and_the_barrier_reads_them(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit asks the server to flush the WAL at its COMMIT (``p_sync``), waited or not;
    an unwaited one's call does not wait for its reply, and the barrier reads the replies
    without a statement of its own (``design/postgres.md`` "Durability"). ``none`` never asks
    for the flush."""
    flushed: list[bool] = []
    real = PostgresSessionStore._commit_params

    def spy(self: Any, ops: Any, last_seq: int) -> list[Any]:
        params = real(self, ops, last_seq)
        flushed.append(params[3] == "t")  # p_sync: does this commit wait for the WAL flush
        return params

    monkeypatch.setattr(PostgresSessionStore, "_commit_params", spy)
    s = pg_store.create_session("/p")
    assert isinstance(s, PostgresSessionStore)
    s.commit([RecordOp(rec("w1"))])
    s.commit([RecordOp(rec("u1"))], wait=False)
    s.commit([RecordOp(rec("u2"))], wait=False)
    assert flushed == [True, True, True]
    # u2's reply is unread (the call did not wait for it); u1's may have been read already,
    # when it had arrived before u2 went out on the connection (Pipeline.usable)
    assert s._pipe is not None and 1 <= len(s._pipe.units) <= 2
    sent: list[str] = []
    monkeypatch.setattr(unwaited.Pipeline, "send", lambda *a, **k: sent.append(a[1]))
    s.wait_durable()
    assert s._pipe is None and sent == [] and s.last_seq() == 3
    s.close()
    flushed.clear()
    n = pg_store.create_session("/p", durability="none")
    n.commit([RecordOp(rec("n1"))])
    n.commit([RecordOp(rec("n2"))], wait=False)
    n.wait_durable()
    assert flushed == [False, False] and n.last_seq() == 2
    n.close()


@pytest.mark.timeout(120)
def test_a_barrier_makes_unwaited_commits_survive_a_server_crash(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    s = pg_store.create_session("/p")
    for i in range(10):
        s.commit([RecordOp(rec(f"u{i}"))], wait=False)
    s.wait_durable()
    pg_cluster.restart("immediate")
    again = open_store(pg_store.spec).open_session(s.session_id, write=False)
    try:
        assert ids(again.records()) == [f"u{i}" for i in range(10)]
    finally:
        again.close()
    s.close()


def test_a_writer_whose_last_seq_moved_reloads_and_goes_on(
    pg_cluster: Any, pg_store: PostgresStore
) -> None:
    s = pg_store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    # something outside the lease protocol moved last_seq (a hand edit): the fence sees it
    pg_cluster.execute(
        f"UPDATE sessions SET last_seq = 5 WHERE id = '{s.session_id}'", pg_store.spec
    )
    assert s.commit([EntryOp(ent("e2", "e1"), lane="main")]) == 6
    assert s.last_seq() == 6 and s.lane("main").leaf_id == "e2"
    s.close()
    ro = pg_store.open_session(s.session_id, write=False)
    try:
        assert [(d["kind"], d["seq"]) for d in ro.damage] == [("seq_gap", 6)]
    finally:
        ro.close()


def test_a_bad_call_in_a_commit_group_fails_alone(pg_store: PostgresStore) -> None:
    import anyio

    from durable_harness.errors import IdConflict

    s = pg_store.create_session("/p", durability="batch")
    s.commit([EntryOp(ent("e1"), lane="main")])
    got: dict[str, Any] = {}

    async def call(name: str, ops: list[Any]) -> None:
        try:
            got[name] = await s.commit_async(ops)
        except IdConflict as exc:
            got[name] = exc

    async def main_() -> None:
        async with anyio.create_task_group() as tg:  # queued together: one group
            tg.start_soon(call, "a", [RecordOp(rec("ra")), LaneOp("side", config={"m": 1})])
            tg.start_soon(call, "bad", [RecordOp(rec("rb")), EntryOp(ent("e1"))])
            tg.start_soon(call, "c", [EntryOp(ent("e2", "e1"), lane="main")])

    anyio.run(main_)
    assert isinstance(got["bad"], IdConflict) and "e1" in str(got["bad"])
    assert (got["a"], got["c"]) == (3, 4)
    assert s.last_seq() == 4 and s.lane("main").leaf_id == "e2"
    assert s.lane("side").config == {"m": 1}
    s.close()
    ro = pg_store.open_session(s.session_id, write=False)
    try:
        assert ids(ro.records()) == ["ra"] and ids(ro.iter_entries()) == ["e1", "e2"]
        assert ro.lanes()["side"].config == {"m": 1} and ro.damage == []
    finally:
        ro.close()
