"""``python -m bench postgres``: the PostgreSQL backend on one throw-away server (started here,
``durable_harness/testing/pgcluster.py``), every figure measured in the same run:

* **per turn, ours vs DBOS on the same PostgreSQL**: the harness's tool turn (``child_ours``
  of ``bench_harness``, ``sync``) against a DBOS workflow of two steps per turn whose system
  database is on the same server (``child_dbos``), ``ROUNDS`` rounds of fresh processes after
  one uncounted warm-up round, the two taking turns going first, the median of the per-round
  ratios (goal: at most 0.2, issue 22). Ours on SQLite beside it.
* **commits per second with 1, 2 and 4 writer processes**, each committing one record per
  commit into a session of its own (``sync``), all starting at one instant; beside SQLite
  (one database file, a session per process).
* **recovery claims per second with 1, 2 and 4 worker processes**: ``CLAIM_SESSIONS`` crashed
  sessions (a held, expired lease) claimed with ``PostgresStore.claim_expired`` (``FOR UPDATE
  SKIP LOCKED``) and released, until none is left.

Writes ``bench/results/postgres.json``. Skipped (with the reason) when no server binaries are
found.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import (
    child_main,
    fs_type,
    load_snapshot,
    log,
    machine_info,
    median,
    run_child,
    scratch_dir,
    target,
    write_results,
)

N_TURNS = 100
ROUNDS = 3
COMMITS_PER_WRITER = 400
CLAIM_SESSIONS = 400
WORKERS = (1, 2, 4)
CHILD_TIMEOUT = 300.0


def _schema_spec(base: str) -> str:
    """A fresh schema on the server: its spec."""
    import psycopg

    name = f"b_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{base}?options=-csearch_path%3D{name}"


def _wait_until(start_at: float) -> None:
    while (left := start_at - time.time()) > 0:
        time.sleep(min(left, 0.01))


# -- children ----------------------------------------------------------------------------------
def child_commits(spec: str, count: int, start_at: float) -> dict[str, Any]:
    """(fresh process) ``count`` sync commits of one record into a new session of ``spec``,
    starting at wall time ``start_at``."""
    from durable_harness.storage import RecordOp, open_store

    store = open_store(spec)
    s = store.create_session("/bench")
    s.commit([RecordOp({"type": "note", "id": "warm", "timestamp": "t"})])
    _wait_until(start_at)
    t0 = time.perf_counter()
    for i in range(count):
        s.commit([RecordOp({"type": "note", "id": f"r{i}", "lane": "main", "timestamp": "t"})])
    seconds = time.perf_counter() - t0
    end = time.time()
    s.close()
    return {"commits": count, "seconds": seconds, "end": end}


def child_claims(spec: str, start_at: float) -> dict[str, Any]:
    """(fresh process) Claim crashed sessions of ``spec`` ten at a time, releasing each, until
    none is left; starting at wall time ``start_at``."""
    from durable_harness.storage import open_store
    from durable_harness.storage.postgres import PostgresStore

    store = open_store(spec)
    assert isinstance(store, PostgresStore)
    _wait_until(start_at)
    claimed = 0
    while True:
        got = store.claim_expired(10)
        if not got:
            break
        for s in got:
            s.close()
        claimed += len(got)
    return {"claimed": claimed, "end": time.time()}


# -- parent ------------------------------------------------------------------------------------
def _together(func: str, args: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run one child per ``args`` at once (each waits for the common ``start_at``)."""
    with ThreadPoolExecutor(max_workers=len(args)) as pool:
        futures = [
            pool.submit(run_child, "bench.bench_postgres", func, a, timeout=CHILD_TIMEOUT)
            for a in args
        ]
        return [f.result() for f in futures]


def commits_per_second(spec: str, workers: int) -> dict[str, Any]:
    """Aggregate commits per second of ``workers`` processes writing at once into ``spec``."""
    start_at = time.time() + 3.0 + workers
    res = _together(
        "child_commits",
        [{"spec": spec, "count": COMMITS_PER_WRITER, "start_at": start_at}] * workers,
    )
    errors = [r["error"] for r in res if "error" in r]
    if errors:
        return {"error": errors[0][:500]}
    total = sum(r["commits"] for r in res)
    wall = max(r["end"] for r in res) - start_at
    return {
        "workers": workers,
        "commits": total,
        "wall_seconds": round(wall, 3),
        "commits_per_second": round(total / wall, 1),
        "us_per_commit_each": round(median([r["seconds"] / r["commits"] * 1e6 for r in res]), 1),
    }


def claims_per_second(base: str, workers: int) -> dict[str, Any]:
    """Claims per second of ``workers`` processes sharing ``CLAIM_SESSIONS`` crashed sessions."""
    import psycopg

    from durable_harness.storage import RecordOp, open_store

    spec = _schema_spec(base)
    store = open_store(spec)
    for _ in range(CLAIM_SESSIONS):
        s = store.create_session("/bench")
        s.commit([RecordOp({"type": "note", "id": "before", "timestamp": "t"})])
        s.lease = None  # type: ignore[attr-defined]  # left held, as a killed process does
        s.close()
    schema = spec.rsplit("%3D", 1)[1]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {schema}.leases SET host = 'gone', owner = 'gone:1:1:x', "
            "expires = clock_timestamp() - interval '1 second'"
        )
    start_at = time.time() + 3.0 + workers
    res = _together("child_claims", [{"spec": spec, "start_at": start_at}] * workers)
    errors = [r["error"] for r in res if "error" in r]
    if errors:
        return {"error": errors[0][:500]}
    claimed = sum(r["claimed"] for r in res)
    wall = max(r["end"] for r in res) - start_at
    return {
        "workers": workers,
        "claimed": claimed,
        "sessions": CLAIM_SESSIONS,
        "per_worker": [r["claimed"] for r in res],
        "wall_seconds": round(wall, 3),
        "claims_per_second": round(claimed / wall, 1),
    }


def server_counters(base: str) -> dict[str, int]:
    """The server's WAL syncs, WAL bytes and committed transactions so far (``pg_stat_wal``,
    ``pg_stat_database``; PostgreSQL 14 or later), read once the backends of a child that has
    exited have reported theirs (a backend reports at its exit)."""
    import psycopg

    time.sleep(0.5)
    with psycopg.connect(base, autocommit=True) as conn:
        wal = conn.execute("SELECT wal_sync, wal_bytes FROM pg_stat_wal").fetchone()
        xact = conn.execute("SELECT sum(xact_commit) FROM pg_stat_database").fetchone()
    assert wal is not None and xact is not None
    return {"wal_syncs": int(wal[0]), "wal_bytes": int(wal[1]), "transactions": int(xact[0])}


def per_turn(base: str, port: int, work: Path) -> dict[str, Any]:
    """Ours (PostgreSQL, SQLite) vs DBOS on the same server, ``ROUNDS`` rounds of fresh
    processes; the ratio is taken within each round, then the median. The server was made a
    moment ago, so one warm-up round of both runs first and is not counted, and the two take
    turns going first (whichever ran first in a round met a colder server). For the two that
    write to the server, its WAL syncs, WAL bytes and transactions per turn
    (:func:`server_counters` around each run, the other runs' included: they do not touch the
    server while it runs)."""
    runs: dict[str, list[dict[str, Any]]] = {"ours_postgres": [], "ours_sqlite": [], "dbos": []}

    def one(name: str, sub: Path, r: int) -> dict[str, Any]:
        if name == "ours_sqlite":
            return child(name, sub, r)
        before = server_counters(base)
        got = child(name, sub, r)
        after = server_counters(base)
        for key in after:
            got[f"server_{key}_per_turn"] = (after[key] - before[key]) / N_TURNS
        return got

    def child(name: str, sub: Path, r: int) -> dict[str, Any]:
        args = {"workdir": str(sub), "n": N_TURNS}
        if name == "dbos":
            dburl = f"postgresql://postgres@127.0.0.1:{port}/dbos_bench_{r}"
            return run_child(
                "bench.bench_harness",
                "child_dbos",
                {**args, "system_database_url": dburl},
                timeout=CHILD_TIMEOUT,
            )
        backend = "postgres" if name == "ours_postgres" else "sqlite"
        return run_child(
            "bench.bench_harness",
            "child_ours",
            {**args, "backend": backend, "mode": "sync"},
            timeout=CHILD_TIMEOUT,
        )

    for r in range(-1, ROUNDS):  # round -1: the warm-up
        sub = work / f"round{r}"
        sub.mkdir()
        os.environ["DH_BENCH_PG"] = _schema_spec(base)
        order = ["ours_postgres", "ours_sqlite", "dbos"]
        if r % 2:
            order.reverse()
        got = {name: one(name, sub, r + 1) for name in order}
        if r < 0:
            log("  warm-up round done (not counted)")
            continue
        for name in runs:
            runs[name].append(got[name])
            log(
                f"  round {r + 1}: {name}: "
                + (
                    f"{got[name]['us_per_turn']:,.0f} us/turn"
                    if "us_per_turn" in got[name]
                    else str(got[name].get("error") or got[name].get("skipped"))[:200]
                )
            )
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        bad = [x for x in rs if "us_per_turn" not in x]
        if bad:
            out[name] = {"skipped": str(bad[0].get("error") or bad[0].get("skipped"))[:500]}
            continue
        out[name] = {
            "us_per_turn": round(median([x["us_per_turn"] for x in rs]), 1),
            "rounds_us_per_turn": [round(x["us_per_turn"], 1) for x in rs],
            "version": rs[-1].get("version"),
        }
        for key in ("wal_syncs", "wal_bytes", "transactions"):
            if f"server_{key}_per_turn" in rs[0]:
                out[name][f"server_{key}_per_turn"] = round(
                    median([x[f"server_{key}_per_turn"] for x in rs]), 2
                )
    for mine in ("ours_postgres", "ours_sqlite"):
        if "skipped" in out[mine] or "skipped" in out["dbos"]:
            out[f"{mine}_vs_dbos"] = None
            continue
        per = [
            a["us_per_turn"] / b["us_per_turn"]
            for a, b in zip(runs[mine], runs["dbos"], strict=True)
        ]
        out[f"{mine}_vs_dbos"] = round(median(per), 3)
        out[f"{mine}_vs_dbos_rounds"] = [round(x, 3) for x in per]
    return out


def run() -> dict[str, Any]:
    """Run the PostgreSQL benchmark; write ``bench/results/postgres.json``; return it."""
    from durable_harness.testing.pgcluster import TemporaryCluster, find_bindir

    results: dict[str, Any] = {"benchmark": "postgres", "machine": machine_info()}
    bindir = find_bindir()
    if bindir is None:
        results.update(
            skipped=["no PostgreSQL server binaries (initdb, pg_ctl)"],
            targets=[],
            summary_rows=[],
        )
        write_results("postgres", results)
        return results
    cluster = TemporaryCluster(bindir)
    try:
        cluster.start()
        base = cluster.spec
        results["server"] = cluster.execute("SHOW server_version")[0][0]
        with scratch_dir("postgres") as work:
            results["scratch_fs"] = fs_type(work)
            log(f"postgres: per turn ({N_TURNS} turns), ours vs DBOS on the same server")
            results["per_turn"] = per_turn(base, cluster.port, work)
            results["commits"] = {}
            for w in WORKERS:
                log(f"postgres: commits per second, {w} writer(s)")
                pg = commits_per_second(_schema_spec(base), w)
                sq = commits_per_second(f"sqlite:{work / f'commits-{w}.db'}", w)
                results["commits"][str(w)] = {"postgres": pg, "sqlite": sq}
                log(
                    f"  postgres {pg.get('commits_per_second')}/s, "
                    f"sqlite {sq.get('commits_per_second')}/s"
                )
            results["claims"] = {}
            for w in WORKERS:
                log(f"postgres: recovery claims per second, {w} worker(s)")
                got = claims_per_second(base, w)
                results["claims"][str(w)] = got
                log(f"  {got.get('claims_per_second')}/s")
    finally:
        cluster.cleanup()
    pt = results["per_turn"]
    results["ratios"] = {
        "ours_postgres_vs_dbos": pt.get("ours_postgres_vs_dbos"),
        "ours_sqlite_vs_dbos": pt.get("ours_sqlite_vs_dbos"),
    }
    results["skipped"] = [
        f"{k}: {v['skipped']}" for k, v in pt.items() if isinstance(v, dict) and "skipped" in v
    ]
    results["load_at_end"] = load_snapshot()
    results["targets"] = [
        target(
            pt.get("ours_postgres_vs_dbos"),
            "<=",
            0.2,
            "PostgreSQL sync per turn vs DBOS on the same PostgreSQL (issue 22)",
        )
    ]
    rows: list[tuple[str, Any, str, str]] = []
    for name in ("ours_postgres", "ours_sqlite", "dbos"):
        res = pt[name]
        if "skipped" in res:
            rows.append((f"per turn: {name}", None, "", res["skipped"][:120]))
        else:
            rows.append(
                (
                    f"per turn: {name}",
                    res["us_per_turn"],
                    "us/turn",
                    f"rounds {res['rounds_us_per_turn']}",
                )
            )
            if "server_wal_syncs_per_turn" in res:
                rows.append(
                    (
                        f"server WAL syncs per turn: {name}",
                        res["server_wal_syncs_per_turn"],
                        "/turn",
                        f"{res['server_transactions_per_turn']} transactions, "
                        f"{res['server_wal_bytes_per_turn']:,.0f} WAL bytes a turn",
                    )
                )
    for w, pair in results["commits"].items():
        for backend in ("postgres", "sqlite"):
            r = pair[backend]
            rows.append(
                (
                    f"commits/s, {w} writer(s), {backend}",
                    r.get("commits_per_second"),
                    "/s",
                    r.get("error", "")[:120] or f"{r.get('us_per_commit_each')} us per commit each",
                )
            )
    for w, r in results["claims"].items():
        rows.append(
            (
                f"claims/s, {w} worker(s)",
                r.get("claims_per_second"),
                "/s",
                r.get("error", "")[:120] or f"per worker {r.get('per_worker')}",
            )
        )
    results["summary_rows"] = rows
    write_results("postgres", results)
    return results


CHILDREN = {"child_commits": child_commits, "child_claims": child_claims}

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(CHILDREN)
    else:
        run()
