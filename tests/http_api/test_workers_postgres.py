"""`durable-harness serve` as a worker of a shared PostgreSQL store (issue 14, "Must show";
``design/host.md``, "Workers"): two worker processes recover ten crashed sessions, each
exactly once; a worker paused past its lease finds its writes refused and stops those
sessions while the other finishes them; the database restarted mid-run loses nothing.

Every check reads the operation log and the lease rows from the database itself."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import StorageError
from durable_harness.storage import open_store

from .util import Server, make_sessions, poll

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.crash]

LEASE_S = "3"  # short leases, so a dead or paused worker's sessions are claimed quickly
FAST = {"DURABLE_HARNESS_PG_LEASE_S": LEASE_S}
METRIC_CLAIMS = "durable_harness_worker_claims_total"


def main_log(spec: str, sid: str) -> list[dict[str, Any]]:
    """The session's lane-``main`` operation log, read from the database."""
    with open_store(spec).open_session(sid, write=False) as store:
        return store.records("main")


def all_records(spec: str, sid: str) -> list[dict[str, Any]]:
    """Every operation-log record of the session (every lane)."""
    with open_store(spec).open_session(sid, write=False) as store:
        return store.records()


def leases(cluster: Any, spec: str) -> dict[str, tuple[int, int | None]]:
    """``{session id: (generation, holder pid)}`` from the ``leases`` table."""
    rows = cluster.execute("SELECT session_id, generation, pid FROM leases", spec)
    return {str(r[0]): (int(r[1]), r[2]) for r in rows}


def finished(spec: str, sids: list[str]) -> bool:
    """Every session's runs finished (``completed``); False while the database is away."""
    try:
        return all(
            [r["outcome"] for r in all_records(spec, sid) if r["type"] == "run_finished"]
            == ["completed"]
            for sid in sids
        )
    except StorageError:
        return False


def lifecycle(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """``[(state, generation)]`` of the session's lifecycle records, in order."""
    return [(r["state"], r["generation"]) for r in records if r["type"] == "session_lifecycle"]


def tool_starts(records: list[dict[str, Any]]) -> Counter[str]:
    """How many times each tool call was started (by call key)."""
    return Counter(r["callKey"] for r in records if r["type"] == "tool_started")


def effect(cwd: Path) -> str:
    """What the session's bash calls appended to ``effect``."""
    path = cwd / "effect"
    return path.read_text() if path.exists() else ""


@pytest.mark.timeout(240)
def test_two_workers_recover_ten_crashed_sessions_each_exactly_once(
    start_server: Callable[..., Server],
    script: Callable[..., str],
    pg_cluster: Any,
    pg_spec: str,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    provider = script(
        [
            {
                "text": "a",
                "tool_calls": [{"name": "bash", "arguments": {"command": "printf a >> effect"}}],
            },
            {
                "text": "b",
                "wait_for": str(gate),
                "tool_calls": [{"name": "bash", "arguments": {"command": "printf b >> effect"}}],
            },
            {"text": "done"},
        ]
    )
    # the workers first: their start-up finds nothing; only their claim loops can recover
    workers = [start_server(pg_spec, "--claim-interval", "0.3", env=FAST) for _ in range(2)]
    crashing = start_server(pg_spec, "--claim-interval", "0", env=FAST)
    dirs = make_sessions(crashing, 10, tmp_path, provider)
    sids = list(dirs)

    def first_tool_done() -> bool:
        # turn 1's call settled (so nothing is in doubt) and turn 2 waits at the gate
        return all(
            sum(r["type"] == "tool_finished" for r in all_records(pg_spec, sid)) == 1
            for sid in sids
        )

    poll(first_tool_done, "every session's first tool call to finish", timeout=60)
    crashing.proc.send_signal(signal.SIGKILL)
    crashing.proc.wait(timeout=10)
    before = leases(pg_cluster, pg_spec)
    assert {before[sid][0] for sid in sids} == {1}  # generation 1: the crashed creator's
    gate.touch()

    poll(lambda: finished(pg_spec, sids), "every run to finish under a worker", timeout=120)
    after = leases(pg_cluster, pg_spec)
    worker_pids = {w.proc.pid for w in workers}
    holders = Counter(after[sid][1] for sid in sids)
    assert set(holders) <= worker_pids, (holders, worker_pids)
    for sid, cwd in dirs.items():
        records = all_records(pg_spec, sid)
        # one takeover: generation 1 -> 2, and one new generation started (its `idle`)
        assert after[sid][0] == 2, (sid, after[sid])
        assert lifecycle(records) == [("idle", 1), ("idle", 2)], lifecycle(records)
        # no tool ran twice: each call started once, each effect done once, in order
        assert set(tool_starts(records).values()) == {1}, tool_starts(records)
        assert effect(cwd) == "ab", (sid, effect(cwd))
    # each worker's /metrics counts the claims it made; together, the ten crashed sessions
    claims = {}
    for w in workers:
        with w.client() as c:
            text = c.get("/metrics").text
        (line,) = [ln for ln in text.splitlines() if ln.startswith(METRIC_CLAIMS + " ")]
        claims[w.proc.pid] = int(float(line.split()[1]))
    assert claims == {pid: holders.get(pid, 0) for pid in worker_pids}, (claims, holders)
    print(f"sessions recovered per worker pid: {dict(holders)}")


@pytest.mark.timeout(240)
def test_a_worker_paused_past_its_lease_is_refused_and_the_other_finishes_its_sessions(
    start_server: Callable[..., Server],
    script: Callable[..., str],
    pg_cluster: Any,
    pg_spec: str,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    provider = script(
        [
            {
                "text": "effect",
                "wait_for": str(gate),
                "tool_calls": [{"name": "bash", "arguments": {"command": "printf b >> effect"}}],
            },
            {"text": "done"},
        ]
    )
    # A's own claim loop is slow, so what stops its sessions is its refused commits
    paused = start_server(pg_spec, "--claim-interval", "600", env=FAST)
    dirs = make_sessions(paused, 4, tmp_path, provider)
    sids = list(dirs)
    with paused.client() as c:
        poll(
            lambda: all(c.get(f"/sessions/{s}").json()["state"] == "running" for s in sids),
            "every session running on A",
        )
    other = start_server(pg_spec, "--claim-interval", "0.3", env=FAST)
    paused.proc.send_signal(signal.SIGSTOP)
    try:
        poll(
            lambda: all(leases(pg_cluster, pg_spec)[s] == (2, other.proc.pid) for s in sids),
            "B to claim every session of the paused A",
            timeout=60,
        )
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    # A wakes up and both workers' providers see the gate at once: B's turns go on, A's
    # commits are refused by the fence, and A stops those sessions (writing nothing) while
    # it goes on serving
    gate.touch()
    poll(lambda: finished(pg_spec, sids), "B to finish every run", timeout=60)

    def refused() -> bool:
        log = paused.stderr()
        return all(f"session {sid} stopped: " in log for sid in sids)

    poll(refused, "A to find its commits refused and stop each session", timeout=60)
    assert "was refused" in paused.stderr()
    assert paused.proc.poll() is None
    with paused.client() as c:
        for sid in sids:
            status = c.get(f"/sessions/{sid}/agent/status").json()
            assert status["generation"] == 2, status  # B's, read from the store: not A's
        # A still serves: a new session runs to the end there
        cwd = tmp_path / "fresh"
        cwd.mkdir()
        fresh_provider = script([{"text": "fresh"}])
        resp = c.post("/sessions", json={"cwd": str(cwd), "provider": fresh_provider})
        assert resp.status_code == 201, resp.text
        fresh = resp.json()["id"]
        assert c.post(f"/sessions/{fresh}/agent/send", json={"message": "hi"}).status_code == 202
        poll(lambda: finished(pg_spec, [fresh]), "a new session on A to finish")
    for sid, cwd in dirs.items():
        records = all_records(pg_spec, sid)
        # nothing of A's after the takeover: no `error` or `closed` over B's record
        assert lifecycle(records) == [("idle", 1), ("idle", 2)], lifecycle(records)
        assert set(tool_starts(records).values()) == {1}
        assert effect(cwd) == "b", (sid, effect(cwd))
        assert leases(pg_cluster, pg_spec)[sid] == (2, other.proc.pid)


@pytest.mark.timeout(240)
def test_runs_finish_across_a_database_restart_and_nothing_accepted_is_lost(
    start_server: Callable[..., Server],
    script: Callable[..., str],
    pg_cluster: Any,
    pg_spec: str,
    tmp_path: Path,
) -> None:
    turns = 12
    provider = script(
        [
            {
                "text": f"step {i}",
                "delay": 0.05,
                "tool_calls": [{"name": "bash", "arguments": {"command": "printf x >> effect"}}],
            }
            for i in range(turns)
        ]
        + [{"text": "done"}]
    )
    server = start_server(pg_spec, "--claim-interval", "0.3")
    dirs = make_sessions(server, 4, tmp_path, provider)
    sids = list(dirs)
    poll(
        lambda: all(len(effect(cwd)) >= 3 for cwd in dirs.values()),
        "every session a few turns in",
        timeout=60,
    )
    pg_cluster.restart()
    assert server.proc.poll() is None
    mid = {sid: len(effect(cwd)) for sid, cwd in dirs.items()}
    assert any(n < turns for n in mid.values()), "the restart came after the runs: too late"
    poll(lambda: finished(pg_spec, sids), "every run to finish after the restart", timeout=120)
    for sid, cwd in dirs.items():
        records = all_records(pg_spec, sid)
        assert set(tool_starts(records).values()) == {1}, tool_starts(records)
        assert len(tool_starts(records)) == turns
        assert effect(cwd) == "x" * turns, (sid, effect(cwd))
        prompts = [r for r in records if r["type"] == "run_started"]
        assert len(prompts) == 1  # the accepted prompt is there, once
    with server.client() as c:
        assert c.get("/sessions").status_code == 200
