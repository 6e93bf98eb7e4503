"""The host's worker loop (``durable_harness/host/worker.py``, ``design/host.md`` "Workers"), in
process: the capability checks, the claim of a crashed session, and a database that stays away
longer than a commit's reconnect deadline (the commit's outcome unknown): the generation stops
without a lifecycle record, the session is handed back and claimed again once the server is
back, and its run finishes with no commit applied twice. The multi-process runs (two workers,
a paused worker, a restart) are in ``tests/http_api/test_workers_postgres.py``."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import StaleGeneration, StorageError
from durable_harness.harness.records import record
from durable_harness.host import HostOptions, SessionManager
from durable_harness.host import worker as host_worker
from durable_harness.storage import RecordOp, open_store
from durable_harness.storage.postgres import connection as pg_connection
from durable_harness.storage.postgres import store as pg_session_store
from durable_harness.storage.postgres.catalogue import PostgresStore

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def provider(tmp_path: Path, turns: list[dict[str, Any]]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


async def until(check: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Poll ``check`` (a store read may fail while the server is away) until true."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except StorageError:
            pass
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out after {limit}s waiting for {what}")


def run_completed(spec: str, session_id: str) -> bool:
    """True once the session's one run has finished ``completed``."""
    outcomes = [r["outcome"] for r in log(spec, session_id) if r["type"] == "run_finished"]
    return outcomes == ["completed"]


def log(spec: str, sid: str) -> list[dict[str, Any]]:
    with open_store(spec).open_session(sid, write=False) as s:
        return s.records()


def test_only_stores_that_claim_run_the_worker(tmp_path: Path) -> None:
    jsonl = open_store(f"jsonl:{tmp_path / 'j'}")
    assert not host_worker.can_claim(jsonl)
    assert host_worker.writer_lost(StaleGeneration("fenced"), jsonl.create_session("/"))


@pytest.mark.postgres
async def test_a_running_manager_claims_a_session_whose_writer_died(
    pg_spec: str, tmp_path: Path
) -> None:
    store = PostgresStore(pg_spec, lease_s=1)
    options = HostOptions(provider=provider(tmp_path, [{"text": "hi"}]), claim_interval=0.2)
    async with SessionManager(store, options) as m:
        assert m.worker is not None and m.worker.claimed == []
        crashed = store.create_session(str(tmp_path))
        idle = record("session_lifecycle", "main", None, state="idle", generation=1, mode="sync")
        crashed.commit([RecordOp(idle)])  # a host's generation 1 was up, then its process died
        crashed.lease = None  # type: ignore[attr-defined]  # "crash": the lease is left held
        crashed.close()
        store.db.run(  # ...on another machine, and its lease ran out
            lambda c: c.execute(
                "UPDATE leases SET host = 'elsewhere', owner = 'elsewhere:1:1:dead', "
                "expires = clock_timestamp() - interval '1 second'"
            )
        )
        sid = crashed.session_id
        await until(lambda: sid in m.live, "the worker to claim and resume the session")
        assert m.worker.claimed == [sid]
        assert (await m.get(sid)).generation == 2


@pytest.mark.postgres
async def test_an_idle_generation_whose_lease_was_taken_is_stopped_writing_nothing(
    pg_spec: str, tmp_path: Path
) -> None:
    store = PostgresStore(pg_spec, lease_s=1)
    options = HostOptions(provider=provider(tmp_path, [{"text": "hi"}]), claim_interval=0.2)
    async with SessionManager(store, options) as m:
        sid = (await m.create(str(tmp_path))).id
        events = m.listen(sid)
        # another writer breaks the lease (as a claim after a pause would take it)
        thief = PostgresStore(pg_spec).open_session(sid, break_lease=True)
        await until(lambda: sid not in m.live, "the fenced generation to stop")
        seen = [e.get("state") async for e in events]  # the stream ends with the generation
        assert seen[-1:] == ["suspended"], seen
        thief.commit([RecordOp({"type": "note", "id": "n", "lane": "main", "timestamp": "x"})])
        states = [r["state"] for r in log(pg_spec, sid) if r["type"] == "session_lifecycle"]
        assert states == ["idle"]  # nothing written over the new owner
        assert (await m.get(sid)).state == "idle"  # read from the store: the new holder is live
        thief.close()


@pytest.mark.postgres
@pytest.mark.slow
async def test_a_database_away_past_the_reconnect_deadline_hands_the_session_back(
    pg_cluster: Any, pg_spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a commit gives up reconnecting after 1 s, a connection attempt after 2 s (30 s and 10 s
    # in production): the test's outage outlasts both in seconds, not minutes
    monkeypatch.setattr(pg_session_store, "RECONNECT_DEADLINE_S", 1.0)
    monkeypatch.setattr(pg_connection, "CONNECT_TIMEOUT_S", 2)
    turns = 40
    spec = provider(
        tmp_path,
        [
            {
                "text": f"step {i}",
                "delay": 0.02,
                "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
            }
            for i in range(turns)
        ]
        + [{"text": "done"}],
    )
    (tmp_path / "notes.txt").write_text("notes\n")
    store = PostgresStore(pg_spec, lease_s=2)
    options = HostOptions(provider=spec, claim_interval=0.3)
    async with SessionManager(store, options) as m:
        rec = await m.create(str(tmp_path))
        sid = rec.id
        await m.send(sid, "go")
        await until(
            lambda: sum(r["type"] == "tool_finished" for r in log(pg_spec, sid)) >= 3,
            "a few turns",
        )
        pg_cluster.stop()
        try:
            await until(lambda: sid not in m.live, "the generation to stop", limit=60)
        finally:
            pg_cluster.start()
        await until(
            lambda: run_completed(pg_spec, sid),
            "the run to finish under the next generation",
            limit=60,
        )
        records = log(pg_spec, sid)
        states = [r["state"] for r in records if r["type"] == "session_lifecycle"]
        assert "error" not in states and states[0] == "idle" and len(states) >= 2, states
        assert m.worker is not None and sid in m.worker.claimed
        finished = Counter(r["callKey"] for r in records if r["type"] == "tool_finished")
        assert set(finished.values()) == {1}, finished  # no settlement applied twice
        assert len(finished) == turns
        with store.open_session(sid, write=False) as ro:
            assert ro.damage == []  # no hole, no seq twice


@pytest.mark.postgres
@pytest.mark.slow
async def test_the_claim_loop_claims_again_once_the_restarted_server_is_back(
    pg_cluster: Any, pg_spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 22: a worker reached the server 20-27 s after it came back (the pool's backoff,
    # a failed round retried only after the whole interval); here it must claim and serve
    # again, waited for with a generous limit (the figure, < 5 s, is bench restart's (b))
    monkeypatch.setattr(pg_connection, "CONNECT_TIMEOUT_S", 2)  # a failed round in 2 s, not 10
    store = PostgresStore(pg_spec, lease_s=1)
    options = HostOptions(provider=provider(tmp_path, [{"text": "hi"}]), claim_interval=5.0)
    async with SessionManager(store, options) as m:
        assert m.worker is not None
        pg_cluster.stop()
        try:
            await until(lambda: m.worker is not None and m.worker.failures >= 1, "a failed round")
        finally:
            pg_cluster.start()
        crashed = store.create_session(str(tmp_path))  # a writer that dies once it is back
        idle = record("session_lifecycle", "main", None, state="idle", generation=1, mode="sync")
        crashed.commit([RecordOp(idle)])
        crashed.lease = None  # type: ignore[attr-defined]  # "crash": the lease is left held
        crashed.close()
        store.db.run(
            lambda c: c.execute(
                "UPDATE leases SET host = 'elsewhere', owner = 'elsewhere:1:1:dead', "
                "expires = clock_timestamp() - interval '1 second'"
            )
        )
        sid = crashed.session_id
        await until(lambda: sid in m.live, "the worker to claim the session", limit=120)
        assert m.worker.claimed == [sid]
        await m.send(sid, "hello")
        await until(
            lambda: run_completed(pg_spec, sid), "the claimed session to serve a run", limit=120
        )
