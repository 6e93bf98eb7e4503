"""Run the benchmarks: ``python -m bench`` (all) or ``python -m bench storage harness sessions``;
``--quick`` asks the benchmarks that support it (``host``) for small numbers.

Prints a summary table and every target's verdict. Exit status: 0 when every benchmark ran
(failed targets included: they are findings, not errors), 1 when a benchmark crashed, and with
``--strict`` also 1 when a target failed.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from typing import Any

from bench.common import fmt

BENCHMARKS = {
    "storage": "bench.bench_storage",
    "harness": "bench.bench_harness",
    "sessions": "bench.bench_sessions",
    "host": "bench.bench_host",
    "postgres": "bench.bench_postgres",
    "crash": "bench.bench_crash",
    "restart": "bench.bench_restart",
    "streams": "bench.bench_streams",
}


def _print_summary(name: str, results: dict[str, Any], seconds: float) -> int:
    where = os.environ.get("DH_BENCH_RESULTS") or "bench/results"
    print(f"\n== {name} ({seconds:.1f} s) -> {where}/{name}.json")
    start = results.get("machine", {}).get("load_at_start", {})
    end = results.get("load_at_end", {})
    print(
        f"  scratch {results.get('scratch_fs', '?')}; load {start.get('loadavg')} -> "
        f"{end.get('loadavg')}; io pressure avg10 {start.get('io_pressure_some_avg10')}% -> "
        f"{end.get('io_pressure_some_avg10')}%"
    )
    rows = results.get("summary_rows", [])
    width = max((len(r[0]) for r in rows), default=10)
    for label, value, unit, note in rows:
        print(f"  {label:<{width}}  {fmt(value, unit):>18}  {note}")
    failed = 0
    print("  targets:")
    for t in results.get("targets", []):
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[t["pass"]]
        failed += t["pass"] is False
        print(f"    [{verdict}] {t['what']}: {fmt(t['value'])} {t['op']} {t['threshold']}")
    for note in results.get("skipped", []):
        print(f"    [SKIP] {note}")
    return failed


def main(argv: list[str]) -> int:
    strict = "--strict" in argv
    if "--quick" in argv:  # small numbers, for a smoke run (benchmarks that support it)
        os.environ["DH_BENCH_QUICK"] = "1"
    names = [a for a in argv if not a.startswith("--")] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    crashed = 0
    failed = 0
    started = time.perf_counter()
    summaries: list[tuple[str, dict[str, Any], float]] = []
    for name in names:
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            results = importlib.import_module(BENCHMARKS[name]).run()
        except Exception:
            traceback.print_exc()
            crashed += 1
            continue
        summaries.append((name, results, time.perf_counter() - t0))
    for name, results, seconds in summaries:
        failed += _print_summary(name, results, seconds)
    print(
        f"\ntotal {time.perf_counter() - started:.1f} s; {failed} target(s) failed; "
        f"{crashed} benchmark(s) crashed"
    )
    return 1 if crashed or (strict and failed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
