"""Shared helpers for the benchmarks: timing, fresh-subprocess measurements, targets, JSON.

Conventions:

* Every time is measured with :func:`time.perf_counter` and reported in microseconds (``_us``),
  milliseconds (``_ms``) or seconds (``_s``); rates are per second (``_per_s``).
* Every ratio is taken against a baseline measured in the same run, on the same machine and
  the same filesystem, never against a number from elsewhere.
* Scratch files go under :func:`scratch_root`: ``$DH_BENCH_TMP`` if set, else
  ``bench/results/tmp`` (inside the work tree, so on the filesystem a session store normally
  lives on). Each benchmark records the directory and its filesystem type.
* Peak memory is ``ru_maxrss`` (Linux: KiB) read in a fresh subprocess, before and after the
  measured work, so the delta is the high-water mark the work added.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
RESULT_MARKER = "BENCH-RESULT "


# -- scratch directories -----------------------------------------------------------------------
def scratch_root() -> Path:
    """Return the parent of every scratch directory (created if missing)."""
    root = Path(os.environ.get("DH_BENCH_TMP") or RESULTS_DIR / "tmp")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory under :func:`scratch_root`, removed afterwards (kept when
    ``$DH_BENCH_KEEP`` is set)."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=scratch_root()))
    try:
        yield path
    finally:
        if not os.environ.get("DH_BENCH_KEEP"):
            shutil.rmtree(path, ignore_errors=True)


def fs_type(path: Path) -> str:
    """Return the filesystem type of the mount holding ``path`` (from ``/proc/mounts``)."""
    best, kind = "", "unknown"
    target = str(Path(path).resolve())
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1]
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > len(best):
                    best, kind = mnt, f"{parts[2]} ({parts[0]} on {mnt})"
    except OSError:
        pass
    return kind


def load_snapshot() -> dict[str, Any]:
    """Load average and I/O pressure now: other processes on the machine (tests of other work
    running at the same time) move fsync latency and CPU time, so results carry this."""
    snap: dict[str, Any] = {}
    try:
        snap["loadavg"] = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        pass
    try:
        line = Path("/proc/pressure/io").read_text().splitlines()[0]
        snap["io_pressure_some_avg10"] = float(line.split("avg10=")[1].split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return snap


def machine_info() -> dict[str, Any]:
    """Return the facts that make figures comparable: CPU count, Python, platform."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "scratch_root": str(scratch_root()),
        "scratch_fs": fs_type(scratch_root()),
        "load_at_start": load_snapshot(),
    }


# -- timing ------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> float:
    """Run ``fn`` once and return the elapsed seconds."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median(values: list[float]) -> float:
    """The median of ``values`` (0.0 for an empty list)."""
    return statistics.median(values) if values else 0.0


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by nearest rank."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def rate(count: int, seconds: float) -> float:
    """Operations per second (0.0 when no time elapsed)."""
    return count / seconds if seconds > 0 else 0.0


def ratio(a: float, b: float) -> float | None:
    """``a / b`` rounded to 3 places, or ``None`` when ``b`` is zero."""
    return round(a / b, 3) if b else None


def peak_rss_kib() -> int:
    """The process's peak resident set size so far (``ru_maxrss``, KiB on Linux).

    Caveat (Linux): a child's ``ru_maxrss`` starts from its parent's peak at ``fork`` (the
    kernel keeps the larger of the two across ``exec``), so in a subprocess of a big parent it
    hides the child's own growth. :func:`memory_probe` reads the per-process ``VmHWM`` instead.
    """
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class MemoryProbe:
    """Peak-RSS delta of a piece of work, measured in the current process.

    ``start()`` resets the kernel's high-water mark to the current RSS (``/proc/self/clear_refs``
    with ``5``, Linux >= 4.0) and reads the baseline; ``stop()`` reads ``VmHWM``. Where the
    reset is not available the baseline is the ``VmHWM`` before the work (an upper bound on
    the baseline, so the delta is a lower bound). Figures in KiB; ``ru_maxrss`` is kept too.
    """

    def __init__(self) -> None:
        self.reset = False
        self.baseline_kib = 0
        self.peak_kib = 0
        self.ru_maxrss_before_kib = 0
        self.ru_maxrss_after_kib = 0

    def start(self) -> None:
        import gc

        gc.collect()
        self.ru_maxrss_before_kib = peak_rss_kib()
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        base = _status_kib("VmRSS" if self.reset else "VmHWM")
        self.baseline_kib = base if base is not None else self.ru_maxrss_before_kib

    def stop(self) -> dict[str, Any]:
        peak = _status_kib("VmHWM")
        self.ru_maxrss_after_kib = peak_rss_kib()
        self.peak_kib = peak if peak is not None else self.ru_maxrss_after_kib
        return {
            "baseline_rss_kib": self.baseline_kib,
            "peak_rss_kib": self.peak_kib,
            "peak_delta_kib": self.peak_kib - self.baseline_kib,
            "hwm_reset": self.reset,
            "ru_maxrss_delta_kib": self.ru_maxrss_after_kib - self.ru_maxrss_before_kib,
        }


# -- targets -----------------------------------------------------------------------------------
def target(value: float | None, op: str, threshold: float, what: str) -> dict[str, Any]:
    """A pass/fail verdict: ``value op threshold`` with ``op`` one of ``>=``, ``<=``, ``<``.

    A ``None`` value (the measurement was skipped) is neither pass nor fail.
    """
    if value is None:
        return {"what": what, "value": None, "op": op, "threshold": threshold, "pass": None}
    ok = {
        ">=": value >= threshold,
        "<=": value <= threshold,
        "<": value < threshold,
        ">": value > threshold,
    }[op]
    return {
        "what": what,
        "value": round(float(value), 4),
        "op": op,
        "threshold": threshold,
        "pass": bool(ok),
    }


# -- results -----------------------------------------------------------------------------------
def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` to ``bench/results/<name>.json`` (or ``$DH_BENCH_RESULTS/<name>.json``:
    a smoke test keeps the real results) and return the path."""
    directory = Path(os.environ.get("DH_BENCH_RESULTS") or RESULTS_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path


def log(msg: str) -> None:
    """Progress line on stderr (stdout of children carries only the result)."""
    print(msg, file=sys.stderr, flush=True)


# -- fresh subprocesses ------------------------------------------------------------------------
def run_child(
    module: str,
    func: str,
    args: dict[str, Any],
    *,
    timeout: float = 120.0,
    prefix: list[str] | None = None,
) -> dict[str, Any]:
    """Run ``func(**args)`` of ``module`` in a fresh interpreter and return its result dict.

    The child is ``python -m <module> --child <func> <json args>`` (see :func:`child_main`),
    run under ``prefix`` (e.g. an ``strace`` command line) when given. A child that fails or
    times out yields ``{"error": ...}`` instead of raising.
    """
    cmd = [*(prefix or []), sys.executable, "-m", module, "--child", func, json.dumps(args)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            result: dict[str, Any] = json.loads(line[len(RESULT_MARKER) :])
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
    return {"error": f"child exited {proc.returncode}: " + " | ".join(tail)}


def child_main(children: dict[str, Callable[..., dict[str, Any]]]) -> None:
    """Entry point of a benchmark module run as ``python -m MODULE --child FUNC JSON``."""
    if len(sys.argv) != 4 or sys.argv[1] != "--child":
        sys.exit(f"usage: python -m {__package__}.MODULE --child FUNC JSON_ARGS")
    func, args = sys.argv[2], json.loads(sys.argv[3])
    try:
        result = children[func](**args)
    except Exception as exc:  # reported to the parent as data, never as a crash
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    print(RESULT_MARKER + json.dumps(result, default=str), flush=True)


def fmt(value: Any, unit: str = "") -> str:
    """Compact human form of a number for the summary table."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 100:
            text = f"{value:,.0f}"
        elif abs(value) >= 10:
            text = f"{value:.1f}"
        else:
            text = f"{value:.3g}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()
