"""Crash cells: warm (forked from the fork server) against fresh interpreters, side by side.

Each measurement is one ``durable-harness crash-test`` run in its own process, with the CLI's
default jobs (``runner.DEFAULT_JOBS``, what a user gets: 8 on 2 cores); its CPU is that
process's and all its descendants' (``RUSAGE_CHILDREN`` of this process, before and after: the
fork server's children are reaped by the server, the server by the runner, the runner by us),
its wall and cell count come from the run's ``--report`` JSON (``run_matrix``'s own clock).

- ``single_tool`` on JSONL and SQLite, fresh (``DURABLE_HARNESS_CRASHTEST_FORK=0``) and warm,
  alternating: CPU per cell, the ratio warm / fresh (issue 22: at most 1/5).
- The built-in matrix on JSONL and SQLite, warm: wall (issue 22: under 60 s on 2 quiet cores).
- ``single_tool`` on PostgreSQL (a throw-away cluster) against SQLite, warm: cells per second
  (issue 22: PostgreSQL within 2x of SQLite).

``--quick`` (``DH_BENCH_QUICK=1``): ``single_tool`` on JSONL only (15 cells), once each way,
no full matrix; PostgreSQL and SQLite at two crash points.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    fs_type,
    load_snapshot,
    log,
    machine_info,
    ratio,
    scratch_dir,
    target,
    write_results,
)

FORK_ENV = "DURABLE_HARNESS_CRASHTEST_FORK"
PG_ENV = "DURABLE_HARNESS_CRASHTEST_PG"
QUICK_POINTS = ["--point", "after_tool_started", "--point", "after_tool_finished"]


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def crash_test(
    work: Path, name: str, args: list[str], *, fork: bool, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One ``crash-test`` run with ``args``; returns cells, CPU (s), wall (s), per-cell figures."""
    report = work / f"{name}.json"
    run_env = os.environ | (env or {}) | {FORK_ENV: "1" if fork else "0"}
    cmd = [sys.executable, "-m", "durable_harness", "crash-test"]  # its default jobs
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(
        [*cmd, *args, "--report", str(report)],
        cwd=REPO_ROOT,
        env=run_env,
        capture_output=True,
        text=True,
        check=False,
    )
    cpu, outer = _children_cpu() - cpu0, time.perf_counter() - t0
    if not report.exists():
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}"}
    summary = json.loads(report.read_text())["summary"]
    cells = int(summary["cells"])
    wall = float(summary["wall_seconds"])
    return {
        "cells": cells,
        "passed": summary["passed"],
        "cpu_s": round(cpu, 2),
        "cpu_per_cell_s": round(cpu / cells, 4) if cells else None,
        "wall_s": wall,
        "process_wall_s": round(outer, 2),
        "cells_per_s": round(cells / wall, 3) if wall else None,
    }


def run() -> dict[str, Any]:
    """Run the crash-cell benchmark; write ``bench/results/crash.json``; return it."""
    quick = os.environ.get("DH_BENCH_QUICK") == "1"
    results: dict[str, Any] = {"benchmark": "crash", "machine": machine_info(), "quick": quick}
    backends = ["--backend", "jsonl"] if quick else ["--backend", "jsonl", "--backend", "sqlite"]
    cell_args = ["--scenario", "single_tool", *backends]
    runs: dict[str, Any] = {}
    skipped: list[str] = []
    with scratch_dir("crash") as work:
        results["scratch_fs"] = fs_type(work)
        for i, fork in enumerate((False, True, False, True) if not quick else (False, True)):
            key = f"single_tool_{'warm' if fork else 'fresh'}_{i // 2}"
            log(f"crash: {key}")
            runs[key] = crash_test(work, key, cell_args, fork=fork)
            log(f"  {runs[key]}")
        if not quick:
            log("crash: full built-in matrix, jsonl + sqlite, warm")
            runs["matrix_warm"] = crash_test(
                work, "matrix", ["--backend", "jsonl", "--backend", "sqlite"], fork=True
            )
            log(f"  {runs['matrix_warm']}")
        pg = _postgres_vs_sqlite(work, quick, runs)
        if pg:
            skipped.append(pg)
    results["runs"] = runs
    results["load_at_end"] = load_snapshot()

    def total(kind: str, field: str) -> float:
        return sum(float(v.get(field) or 0) for k, v in runs.items() if k.startswith(kind))

    def per_cell(kind: str) -> float | None:
        cells = total(kind, "cells")
        return round(total(kind, "cpu_s") / cells, 4) if cells else None

    fresh, warm = per_cell("single_tool_fresh"), per_cell("single_tool_warm")
    cpu_ratio = ratio(warm, fresh) if warm is not None and fresh else None
    pg_rate = runs.get("pg_single_tool", {}).get("cells_per_s")
    sq_rate = runs.get("sqlite_single_tool", {}).get("cells_per_s")
    pg_ratio = ratio(pg_rate, sq_rate) if pg_rate and sq_rate else None
    matrix = runs.get("matrix_warm", {})
    results["ratios"] = {
        "cpu_per_cell_warm_vs_fresh": cpu_ratio,
        "pg_vs_sqlite_cells_per_s": pg_ratio,
    }
    results["targets"] = [
        target(cpu_ratio, "<=", 0.2, "CPU per crash cell, warm / fresh (single_tool, same run)"),
        target(pg_ratio, ">=", 0.5, "PostgreSQL cells/s vs SQLite cells/s (single_tool, warm)"),
    ]
    if not quick:
        results["targets"].append(
            target(matrix.get("wall_s"), "<", 60.0, "built-in matrix, jsonl+sqlite, wall s (warm)")
        )
    results["skipped"] = skipped
    rows: list[tuple[str, Any, str, str]] = [
        ("CPU per cell, fresh interpreters", fresh, "s", "single_tool, RUSAGE_CHILDREN"),
        ("CPU per cell, warm fork server", warm, "s", f"ratio {cpu_ratio}"),
    ]
    for key, r in runs.items():
        note = r.get("error", "")[:120] or f"{r['cells']} cells, {r['cpu_s']} s CPU"
        rows.append((f"{key} cells/s", r.get("cells_per_s"), "/s", note))
    if matrix:
        rows.append(("built-in matrix wall (warm)", matrix.get("wall_s"), "s", ""))
    results["summary_rows"] = rows
    write_results("crash", results)
    return results


def _postgres_vs_sqlite(work: Path, quick: bool, runs: dict[str, Any]) -> str | None:
    """PostgreSQL against SQLite, warm, same cells; returns a skip note or ``None``."""
    from durable_harness.testing.pgcluster import TemporaryCluster, find_bindir

    bindir = find_bindir()
    if bindir is None:
        return "postgres: no PostgreSQL server binaries (initdb, pg_ctl)"
    args = ["--scenario", "single_tool", *(QUICK_POINTS if quick else [])]
    cluster = TemporaryCluster(bindir)
    try:
        cluster.start()
        for name, backend in (("sqlite_single_tool", "sqlite"), ("pg_single_tool", "postgres")):
            log(f"crash: {name}")
            env = {PG_ENV: cluster.spec}
            runs[name] = crash_test(work, name, [*args, "--backend", backend], fork=True, env=env)
            log(f"  {runs[name]}")
    finally:
        cluster.cleanup()
    return None
