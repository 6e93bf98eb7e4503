"""Restart benchmark (issue 22, "The host's restart"): a host restarted over crashed sessions,
and a PostgreSQL worker reconnecting after the server comes back.

* **(a) restart over N crashed sessions** (1,000; ``--quick``: 40). A host process creates N
  sessions on one SQLite store and puts each in flight as ``bench/bench_host.py`` (d) does:
  half in the provider's stream (replay-safe: the plan re-issues the request, no decision,
  so they resume by policy), half in a replay-``never`` tool call (in doubt: they wait for a
  decision); then it SIGKILLs itself. The store is copied, and each copy is restarted by a
  fresh process serving the real HTTP app (``create_app`` + ``http.server.serve``, uvicorn,
  the bench's tools in place of the built-in ones), measured from the spawn: **plans**, the
  manager entered (every session read and planned); **serving**, the first HTTP answer
  (``GET .../agent/status`` of one session, sent as soon as the server announces its URL);
  **resumed**, every start-up resume begun (``SessionManager.wait_resumed``). Two arms in
  the same run: ``before``, the order before issue 22 (the manager entered only after every
  resume: emulated by waiting for the resumes inside ``__aenter__``), and ``now`` (resumes in
  the background). While the resumes run, ``GET .../agent/status`` is asked every 50 ms; its
  latency is reported. Goal: serving <= 1.5x plans (``now``).
* **(b) PostgreSQL reconnect** (skipped without the server binaries): a worker host runs a
  session doing tool turns; the throw-away cluster is stopped for ``OUTAGE_S`` and started
  again; measured: seconds from the server's return to the session's next settled tool call
  (the worker having reconnected, claimed the session its generation lost, and resumed it).
  Arms ``before`` (``psycopg_pool``'s default reconnect backoff and one wait per request, a
  failed claim round retried after the whole interval, a hand-back that failed while the
  server was away left to the lease's expiry: as before issue 22) and ``now``, each in its
  own fresh process. Goal: ``now`` < 5 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from bench.common import (
    REPO_ROOT,
    child_main,
    fs_type,
    load_snapshot,
    log,
    machine_info,
    percentile,
    ratio,
    run_child,
    scratch_dir,
    target,
    write_results,
)

FULL = {"sessions": 1000}
QUICK = {"sessions": 40}
OUTAGE_S = {"full": 20.0, "quick": 6.0}
HOLD_PROVIDER = "hold in the provider"
HOLD_TOOL = "hold in a tool"
SERVE_TIMEOUT = 600.0
ARMS = ("before", "now")


def quick() -> bool:
    """``--quick`` / ``DH_BENCH_QUICK=1``: small numbers (the smoke test)."""
    return os.environ.get("DH_BENCH_QUICK") == "1"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def script(gate: Path) -> dict[str, Any]:
    """The scripted provider's file: the prompt held in the stream until ``gate`` exists
    (created before the restarts, so a resumed request answers), and the one that calls the
    replay-never ``hold`` tool."""
    return {
        "turns": [{"text": "unscripted prompt"}],
        "by_prompt": {
            HOLD_PROVIDER: [{"text": "Thinking it over slowly.", "wait_for": str(gate)}],
            HOLD_TOOL: [{"text": "Deploying.", "tool_calls": [{"name": "hold", "arguments": {}}]}],
        },
    }


def _tools(runtime: str) -> dict[str, Any]:
    from bench.bench_host import HoldTool
    from bench.workload import EchoTool

    return {"echo": EchoTool(), "hold": HoldTool()}


# -- (a) the crashed host -----------------------------------------------------------------


async def _crash(store: str, work: Path, script_path: Path, sessions: int) -> None:
    """The host process: ``sessions`` sessions put in flight, then a SIGKILL of itself."""
    from durable_harness.host import HostOptions, SessionManager

    reached: dict[str, anyio.Event] = {}

    def on_event(sid: str, event: dict[str, Any]) -> None:
        if event.get("type") in ("message_update", "tool_execution_start") and sid in reached:
            reached[sid].set()

    options = HostOptions(provider=f"scripted:{script_path}", auto_resume="never", tools=_tools)
    async with SessionManager(store, options) as manager:
        manager.observe(on_event)
        ids = [(await manager.create(str(work))).id for _ in range(sessions)]
        for i, sid in enumerate(ids):
            reached[sid] = anyio.Event()
            await manager.send(sid, HOLD_PROVIDER if i % 2 == 0 else HOLD_TOOL)
        with anyio.fail_after(300):
            for sid in ids:
                await reached[sid].wait()
        (work / "ids.json").write_text(json.dumps(ids))
        os.kill(os.getpid(), signal.SIGKILL)


def _serve(store: str, script_path: str, arm: str) -> None:
    """The restarted host (a fresh process): the HTTP app on a free loopback port; prints
    ``MARK planned|resumed <epoch s>`` and ``URL <url>`` lines on stdout."""
    t_main = time.time()
    from durable_harness.host import HostOptions, SessionManager
    from durable_harness.http.app import create_app
    from durable_harness.http.server import serve

    def mark(what: str, extra: Any = None) -> None:
        print(f"MARK {what} {time.time()!r} {json.dumps(extra)}", flush=True)

    mark("imported", {"since_main_s": round(time.time() - t_main, 3)})

    class Timed(SessionManager):
        async def __aenter__(self) -> Timed:
            t0 = time.time()
            await super().__aenter__()
            mark(
                "planned", {"in_aenter_s": round(time.time() - t0, 3), "queued": len(self.pending)}
            )
            if arm == "before":  # as before issue 22: every resume done before serving
                await self.wait_resumed()
                mark("resumed", {"live": len(self.live)})
            else:
                assert self.runner.tg is not None
                self.runner.tg.start_soon(self._report)
            return self

        async def _report(self) -> None:
            await self.wait_resumed()
            mark("resumed", {"live": len(self.live)})

    options = HostOptions(provider=f"scripted:{script_path}", tools=_tools)
    app = create_app(lambda: Timed(store, options))
    serve(app, "127.0.0.1", 0, announce=lambda url: print(f"URL {url}", flush=True))


def _restart(store: str, script_path: Path, arm: str, probe_id: str) -> dict[str, Any]:
    """Spawn the restarted host of ``arm`` and time it from the spawn (seconds)."""
    import httpx

    cmd = [sys.executable, "-m", "bench.bench_restart", "--serve", store, str(script_path), arm]
    t_spawn = time.time()
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, text=True, bufsize=1
    )
    marks: dict[str, tuple[float, Any]] = {}
    url: list[str] = []
    announced, resumed = threading.Event(), threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("URL "):
                url.append(line.split()[1])
                announced.set()
            elif line.startswith("MARK "):
                _m, what, at, extra = line.split(" ", 3)
                marks[what] = (float(at), json.loads(extra))
                if what == "resumed":
                    resumed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out: dict[str, Any] = {"arm": arm}
    try:
        if not announced.wait(SERVE_TIMEOUT):
            raise RuntimeError(f"the {arm} host did not announce its URL")
        probe = f"{url[0]}/sessions/{probe_id}/agent/status"
        with httpx.Client(timeout=120) as client:
            first = client.get(probe)
            t_first = time.time()
            assert first.status_code == 200, first.text
            out["first_answer_state"] = first.json()["state"]
            lat: list[float] = []
            while not resumed.is_set():  # answers while the background resumes run
                t = time.perf_counter()
                client.get(probe).raise_for_status()
                lat.append((time.perf_counter() - t) * 1e3)
                resumed.wait(0.05)
            listing = client.get(f"{url[0]}/sessions").json()
        planned_at, planned = marks["planned"]
        resumed_at, done = marks["resumed"]
        out |= {
            "import_s": round(marks["imported"][0] - t_spawn, 3),
            "plans_s": round(planned_at - t_spawn, 3),
            "plans_in_aenter_s": planned["in_aenter_s"],
            "queued_resumes": planned["queued"],
            "serving_s": round(t_first - t_spawn, 3),
            "all_resumed_s": round(resumed_at - t_spawn, 3),
            "live_after": done["live"],
            "answers_while_resuming": len(lat),
            "answer_p50_ms": round(percentile(lat, 50), 1) if lat else None,
            "answer_max_ms": round(max(lat), 1) if lat else None,
            "sessions_listed": len(listing["sessions"]),
            "resumes_pending_after": listing.get("resumes_pending"),
        }
        out["serving_vs_plans"] = ratio(out["serving_s"], out["plans_s"])
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _copy_store(db: Path, into: Path) -> str:
    """A copy of the SQLite store ``db`` (its WAL and shared memory too: it was never
    checkpointed, the host died) in ``into``; returns its spec."""
    into.mkdir()
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db}{suffix}")
        if src.exists():
            shutil.copy2(src, into / f"{db.name}{suffix}")
    return f"sqlite:{into / db.name}"


def restart_phase(work: Path, sessions: int) -> dict[str, Any]:
    """(a): crash once, restart each arm on its own copy."""
    db = work / "host.db"
    gate = work / "gate"
    script_path = work / "script.json"
    script_path.write_text(json.dumps(script(gate)))
    log(f"restart: {sessions} sessions put in flight, then the host SIGKILLed")
    cmd = [sys.executable, "-m", "bench.bench_restart", "--crash", str(db), str(script_path)]
    proc = subprocess.run([*cmd, str(sessions)], cwd=REPO_ROOT, env=_env(), timeout=900)
    if not (work / "ids.json").exists():
        raise RuntimeError(f"the crashing host exited {proc.returncode} before its sessions")
    ids: list[str] = json.loads((work / "ids.json").read_text())
    gate.touch()  # a resumed provider request now answers
    out: dict[str, Any] = {"sessions": sessions, "host_exit": proc.returncode}
    for arm in ARMS:
        spec = _copy_store(db, work / arm)
        log(f"restart: arm {arm}, a fresh host over {sessions} crashed sessions")
        out[arm] = _restart(spec, script_path, arm, ids[0])  # resumed by policy
    return out


# -- (b) PostgreSQL reconnect ---------------------------------------------------------------


def child_reconnect(arm: str, outage_s: float, bindir: str, work: str) -> dict[str, Any]:
    """In a fresh process: a worker host over a throw-away cluster stopped for ``outage_s``;
    seconds from the server's return to the session's next settled tool call."""
    from durable_harness.host import HostOptions, SessionManager
    from durable_harness.host import worker as host_worker
    from durable_harness.storage.postgres import connection, lease
    from durable_harness.storage.postgres.catalogue import PostgresStore
    from durable_harness.testing.pgcluster import TemporaryCluster

    if arm == "before":  # as before issue 22: psycopg_pool's defaults, one wait per request,
        # a failed claim round retried after the whole interval, a failed hand-back not retried
        connection.RECONNECT_CHAIN_S = 300.0
        connection.GETCONN_SLICE_S = float(connection.CONNECT_TIMEOUT_S)
        host_worker.RETRY_FAILED_S = host_worker.DEFAULT_CLAIM_INTERVAL_S
        lease.DbLease._expire_when_back = lambda *_args: None  # type: ignore[method-assign]
    tmp = Path(work)
    turns = [
        {
            "text": f"step {i}",
            "delay": 0.05,
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
        }
        for i in range(2000)
    ]
    (tmp / "script.json").write_text(json.dumps({"turns": [*turns, {"text": "done"}]}))
    (tmp / "notes.txt").write_text("notes\n")
    cluster = TemporaryCluster(bindir, {"fsync": "off"}).start()
    settled: list[float] = []
    marks: dict[str, float] = {}

    def outage() -> None:
        cluster.stop()
        time.sleep(outage_s)
        cluster.start()
        marks["back"] = time.monotonic()

    async def main() -> dict[str, Any]:
        store = PostgresStore(cluster.spec)
        options = HostOptions(provider=f"scripted:{tmp / 'script.json'}")
        async with SessionManager(store, options) as m:
            m.observe(
                lambda sid, e: (
                    settled.append(time.monotonic())
                    if e.get("type") == "tool_execution_end"
                    else None
                )
            )
            rec = await m.create(str(tmp))
            await m.send(rec.id, "go")
            with anyio.fail_after(60):
                while len(settled) < 5:
                    await anyio.sleep(0.05)
            thread = threading.Thread(target=outage, daemon=True)
            thread.start()
            with anyio.fail_after(outage_s + 180):
                while "back" not in marks or not [t for t in settled if t > marks["back"]]:
                    await anyio.sleep(0.05)
            thread.join()
            back = marks["back"]
            first = min(t for t in settled if t > back)
            return {
                "arm": arm,
                "outage_s": outage_s,
                "reconnected_s": round(first - back, 3),
                "worker_claims": len(m.worker.claimed) if m.worker else None,
                "worker_failed_rounds": m.worker.failures if m.worker else None,
            }

    try:
        return anyio.run(main)
    finally:
        cluster.cleanup()


def reconnect_phase(work: Path) -> dict[str, Any] | None:
    """(b), each arm in a fresh process; ``None`` without the server binaries."""
    from durable_harness.testing.pgcluster import find_bindir

    bindir = find_bindir()
    if bindir is None:
        return None
    outage = OUTAGE_S["quick" if quick() else "full"]
    out: dict[str, Any] = {"outage_s": outage}
    for arm in ARMS:
        log(f"reconnect: arm {arm}, the server away {outage} s")
        folder = work / f"pg-{arm}"
        folder.mkdir()
        args = {"arm": arm, "outage_s": outage, "bindir": bindir, "work": str(folder)}
        out[arm] = run_child("bench.bench_restart", "child_reconnect", args, timeout=600.0)
    return out


def run() -> dict[str, Any]:
    """Run the restart benchmark; write ``bench/results/restart.json``; return the results."""
    sizes = QUICK if quick() else FULL
    results: dict[str, Any] = {"benchmark": "restart", "machine": machine_info(), "quick": quick()}
    with scratch_dir("restart") as work:
        results["scratch_fs"] = fs_type(work)
        results["restart"] = rs = restart_phase(work, sizes["sessions"])
        results["reconnect"] = rc = reconnect_phase(work)
    results["load_at_end"] = load_snapshot()
    now, before = rs["now"], rs["before"]
    results["ratios"] = {
        "serving_vs_plans_now": now["serving_vs_plans"],
        "serving_vs_plans_before": before["serving_vs_plans"],
        "serving_now_vs_before": ratio(now["serving_s"], before["serving_s"]),
    }
    n = rs["sessions"]
    results["targets"] = [
        target(
            now["serving_vs_plans"],
            "<=",
            1.5,
            f"restart over {n} crashed sessions: time to serving / time to plans",
        )
    ]
    rows: list[tuple[str, Any, str, str]] = []
    for arm in ARMS:
        a = rs[arm]
        rows += [
            (f"(a) {arm}: plans", a["plans_s"], "s", f"{a['plans_in_aenter_s']} s in __aenter__"),
            (
                f"(a) {arm}: serving",
                a["serving_s"],
                "s",
                f"{a['serving_vs_plans']}x plans; first answer: {a['first_answer_state']}",
            ),
            (
                f"(a) {arm}: all resumed",
                a["all_resumed_s"],
                "s",
                f"{a['queued_resumes']} queued; status p50 {a['answer_p50_ms']} ms, max "
                f"{a['answer_max_ms']} ms over {a['answers_while_resuming']} answers meanwhile",
            ),
        ]
    if rc is None:
        results["skipped"] = ["(b) PostgreSQL reconnect: no server binaries (initdb, pg_ctl)"]
    else:
        got = rc["now"].get("reconnected_s")
        results["targets"].append(
            target(got, "<", 5, "PostgreSQL worker: s from the server's return to serving again")
        )
        for arm in ARMS:
            r = rc[arm]
            rows.append(
                (
                    f"(b) {arm}: reconnected",
                    r.get("reconnected_s"),
                    "s",
                    f"after a {rc['outage_s']} s outage; "
                    + (
                        str(r["error"])[:100]
                        if "error" in r
                        else f"{r['worker_failed_rounds']} failed claim rounds"
                    ),
                )
            )
    results["summary_rows"] = rows
    write_results("restart", results)
    return results


CHILDREN = {"child_reconnect": child_reconnect}

if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--crash":
        db, script_file, count = sys.argv[2], sys.argv[3], int(sys.argv[4])
        anyio.run(_crash, f"sqlite:{db}", Path(db).parent, Path(script_file), count)
    elif len(sys.argv) == 5 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        child_main(CHILDREN)
