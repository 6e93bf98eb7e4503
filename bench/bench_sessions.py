"""Many sessions, one SQLite store: group commit across sessions (``python -m bench sessions``).

Measured in one run, in alternating rounds on one store file, so a drift of the disk's fsync
latency affects every subject alike:

1. **one session, sync** (the baseline): one session commits turn-sized commits alone, each
   ``commit()`` its own transaction and its own WAL sync.
2. **K sessions, batch, commit_async**: K sessions (default 200) of one ``SqliteStore`` object,
   one task each on one event loop, each awaiting ``commit_async`` of the same commits: the
   calls of all sessions share a transaction and a WAL sync (``storage/sqlite/group_commit.py``).
3. **K sessions, batch, unwaited commit + barrier**: the harness's pattern: each task commits
   with ``commit(wait=False)`` (a transaction of its own, no sync) and then awaits
   ``wait_durable_async()``; the barriers of all sessions share one WAL sync.
4. **K sessions, sync, commit_async**: the same tasks in ``sync`` mode, where every call commits
   and syncs at once (nothing is grouped): what the grouping adds.

A turn-sized commit is what the harness commits when a provider turn finishes: the message entry
(moving the lane's leaf) and one operation-log record.

Target (issue 12's storage side): aggregate commits/s of (2) at >= 10x (1), compared by the
median of the per-round ratios. The figures go to ``bench/results/sessions.json``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    fs_type,
    load_snapshot,
    log,
    machine_info,
    median,
    percentile,
    rate,
    scratch_dir,
    target,
    write_results,
)
from bench.workload import commit_entry

SESSIONS = int(os.environ.get("DH_BENCH_SESSIONS", "200"))
PER_SESSION = 10  # commits per session per round
SINGLE_COMMITS = 300  # per round, the one-session baseline
ROUNDS = 5


def turn_ops(i: int, parent: str | None, lane: str = "main") -> tuple[str, list[Any]]:
    """The ops of one turn-sized commit (the message entry and its record); returns the new
    entry's id and the ops."""
    from durable_harness.storage import EntryOp, RecordOp

    entry = commit_entry(i, parent)
    record = {
        "type": "provider_request_finished",
        "id": os.urandom(8).hex(),
        "lane": lane,
        "runId": "0192a0b0-0000-7000-8000-000000000000",
        "timestamp": entry["timestamp"],
        "turn": i,
        "stopReason": "toolUse",
        "entryId": entry["id"],
    }
    return entry["id"], [EntryOp(entry, lane=lane), RecordOp(record)]


def plans(sessions: list[Any], per: int, seed: int) -> list[list[list[Any]]]:
    """For each session, ``per`` chained turn commits under its lane's current leaf."""
    out = []
    for t, s in enumerate(sessions):
        parent = s.lane("main").leaf_id
        plan = []
        for i in range(per):
            parent, ops = turn_ops(seed + t * 1000 + i, parent)
            plan.append(ops)
        out.append(plan)
    return out


def one_session_sync(session: Any, count: int, seed: int) -> dict[str, Any]:
    """``count`` waited ``commit()`` calls of one ``sync`` session, alone."""
    (plan,) = plans([session], count, seed)
    lat: list[float] = []
    t0 = time.perf_counter()
    for ops in plan:
        s = time.perf_counter()
        session.commit(ops)
        lat.append(time.perf_counter() - s)
    return {"commits": count, "seconds": time.perf_counter() - t0, "latencies": lat}


def many_sessions(store: Any, sessions: list[Any], per: int, seed: int, how: str) -> dict[str, Any]:
    """One task per session on one event loop, each committing ``per`` turn commits:
    ``how`` is ``"commit_async"`` or ``"barrier"`` (``commit(wait=False)`` then
    ``wait_durable_async()``). Counts the store's transactions and WAL syncs."""
    import anyio

    work = plans(sessions, per, seed)
    lat: list[float] = []
    go = anyio.Event()

    async def writer(s: Any, plan: list[list[Any]]) -> None:
        await go.wait()
        for ops in plan:
            t = time.perf_counter()
            if how == "commit_async":
                await s.commit_async(ops)
            else:
                s.commit(ops, wait=False)
                await s.wait_durable_async()
            lat.append(time.perf_counter() - t)

    async def main() -> float:
        async with anyio.create_task_group() as tg:
            for s, plan in zip(sessions, work, strict=True):
                tg.start_soon(writer, s, plan)
            await anyio.wait_all_tasks_blocked()  # every task started: time the commits only
            t0 = time.perf_counter()
            go.set()
        return time.perf_counter() - t0

    stats = store.stats
    txns, syncs = stats.transactions, stats.wal_syncs
    seconds = anyio.run(main)
    return {
        "commits": len(sessions) * per,
        "seconds": seconds,
        "latencies": lat,
        "transactions": stats.transactions - txns,
        "wal_syncs": stats.wal_syncs - syncs,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate over rounds, latency percentiles over all calls, calls per sync."""
    rates = [rate(r["commits"], r["seconds"]) for r in runs]
    lat = [x for r in runs for x in r["latencies"]]
    out: dict[str, Any] = {
        "commits_per_s": round(median(rates), 1),
        "rounds_commits_per_s": [round(x, 1) for x in rates],
        "latency_us": {
            "p50": round(percentile(lat, 50) * 1e6, 1),
            "p99": round(percentile(lat, 99) * 1e6, 1),
        },
        "commits": sum(r["commits"] for r in runs),
    }
    if "wal_syncs" in runs[0]:
        commits = sum(r["commits"] for r in runs)
        out["commits_per_transaction"] = round(
            commits / max(sum(r["transactions"] for r in runs), 1), 1
        )
        out["commits_per_wal_sync"] = round(commits / max(sum(r["wal_syncs"] for r in runs), 1), 1)
    return out


def session_benchmarks(work: Path) -> dict[str, Any]:
    """Paired rounds of the four subjects (see the module docstring)."""
    from durable_harness.storage import SqliteStore

    store = SqliteStore(work / "sessions.db")
    cwd = "/bench/sessions"
    single = store.create_session(cwd, durability="sync")
    batch = [store.create_session(cwd, durability="batch") for _ in range(SESSIONS)]
    sync = [store.create_session(cwd, durability="sync") for _ in range(SESSIONS)]
    runs: dict[str, list[dict[str, Any]]] = {}
    k = f"x{SESSIONS}"
    try:
        one_session_sync(single, 50, 0)  # warm-up: pages, code paths
        many_sessions(store, batch, 1, 0, "commit_async")
        for r in range(ROUNDS):
            seed = (r + 1) * 1_000_000
            runs.setdefault("one_sync", []).append(one_session_sync(single, SINGLE_COMMITS, seed))
            for name, sessions, how in (
                (f"batch_commit_async_{k}", batch, "commit_async"),
                (f"batch_barrier_{k}", batch, "barrier"),
                (f"sync_commit_async_{k}", sync, "commit_async"),
            ):
                runs.setdefault(name, []).append(
                    many_sessions(store, sessions, PER_SESSION, seed + 500_000, how)
                )
            log(
                f"  round {r + 1}/{ROUNDS}: one sync {rate_of(runs['one_sync'][-1]):,.0f}/s; "
                + "; ".join(
                    f"{name} {rate_of(rs[-1]):,.0f}/s"
                    for name, rs in runs.items()
                    if name != "one_sync"
                )
            )
    finally:
        for s in [single, *batch, *sync]:
            s.close()
    out: dict[str, Any] = {
        "sessions": SESSIONS,
        "commits_per_session_per_round": PER_SESSION,
        "single_commits_per_round": SINGLE_COMMITS,
        "rounds": ROUNDS,
    }
    for name, rs in runs.items():
        out[name] = summarize(rs)

    def paired(a: str) -> dict[str, Any]:
        per = [rate_of(x) / rate_of(y) for x, y in zip(runs[a], runs["one_sync"], strict=True)]
        return {"median": round(median(per), 2), "rounds": [round(p, 2) for p in per]}

    out["paired_ratios"] = {
        f"{name}_vs_one_sync": paired(name) for name in runs if name != "one_sync"
    }
    return out


def rate_of(run: dict[str, Any]) -> float:
    """Commits per second of one measured run."""
    return rate(run["commits"], run["seconds"])


def run() -> dict[str, Any]:
    """Run the benchmark; write ``bench/results/sessions.json``; return the results."""
    with scratch_dir("sessions") as work:
        results: dict[str, Any] = {
            "benchmark": "sessions",
            "machine": machine_info(),
            "scratch_dir": str(work),
            "scratch_fs": fs_type(work),
        }
        log(f"sessions: {SESSIONS} sessions of one SQLite store")
        s = session_benchmarks(work)
        results["sqlite_sessions"] = s
    k = f"x{SESSIONS}"
    ratios = {name: v["median"] for name, v in s["paired_ratios"].items()}
    results["ratios"] = ratios
    results["targets"] = [
        target(
            ratios[f"batch_commit_async_{k}_vs_one_sync"],
            ">=",
            10.0,
            f"SQLite: {SESSIONS} batch sessions' commit_async, aggregate commits/s vs one "
            "session's sync commits/s",
        )
    ]
    one = s["one_sync"]
    rows = [
        (
            "SQLite one session sync",
            1e6 / one["commits_per_s"],
            "us/commit",
            f"{one['commits_per_s']:,.0f}/s; p99 {one['latency_us']['p99']} us",
        )
    ]
    for name in (f"batch_commit_async_{k}", f"batch_barrier_{k}", f"sync_commit_async_{k}"):
        sub = s[name]
        rows.append(
            (
                f"SQLite {name}",
                sub["commits_per_s"],
                "commits/s",
                f"{ratios[name + '_vs_one_sync']}x one sync; "
                f"{sub['commits_per_transaction']} commits/txn, "
                f"{sub['commits_per_wal_sync']} commits/sync; "
                f"p50 {sub['latency_us']['p50']} us, p99 {sub['latency_us']['p99']} us",
            )
        )
    results["summary_rows"] = rows
    results["load_at_end"] = load_snapshot()
    write_results("sessions", results)
    return results


if __name__ == "__main__":
    run()
    sys.exit(0)
