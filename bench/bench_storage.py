"""Storage benchmark: commit rates against the raw fsync floor, group commit, long sessions.

Measured, all in one run on one filesystem (the scratch directory of ``bench.common``):

1. **floor**: a loop of ``os.write`` + ``os.fdatasync`` of a record as long as a typical commit
   line (the same call the JSONL backend makes in ``sync`` mode).
2. **JSONL** ``sync`` (one writer, one realistic entry per commit), ``batch`` and ``none`` with
   32 writer threads each waiting for its own commit's durability, ``none`` single-writer,
   and ``sync`` with 32 threads (what group commit saves).
3. **SQLite** the same.
4. **Long sessions**: a 100,000-entry JSONL session (~60 MB, a compaction with a settings
   snapshot every 500 entries) opened read-only plus the leaf's context in a fresh process,
   with the peak RSS it adds; SQLite sessions of 1k, 10k and 100k entries opened (store,
   session, ``lanes()``, leaf context) in a fresh process.

Floor and JSONL ``sync`` are measured in alternating rounds and compared by their medians, so
a drift of the disk's fsync latency during the run affects both alike.

Targets (issue 2): JSONL ``sync`` at >= 0.8x the floor; JSONL ``batch`` with 32 concurrent
writers, each awaiting its own commit's durability (``commit_async``), at >= 8x JSONL ``sync``;
the 100k-entry open figures. The commit-rate targets are held to the embedded default, JSONL.
SQLite's rates are reported beside them with the same ratios: a WAL commit writes whole 4 KiB
pages and runs several SQL statements, so its ``sync`` rate sits near 0.6x the floor of a
600-byte append and its group commit is bound by the SQL work of each call. Thirty-two *threads*
are reported too: in CPython they are bound by the GIL and futex wake-ups, and the plain-Python
group-commit floor measured beside them shows the ceiling any thread-based design has here.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    MemoryProbe,
    child_main,
    fs_type,
    load_snapshot,
    log,
    machine_info,
    median,
    percentile,
    rate,
    ratio,
    run_child,
    scratch_dir,
    target,
    write_results,
)
from bench.workload import commit_entry, long_session_entries

ROUNDS = 6
SINGLE_COMMITS = 400  # per round, single writer
THREADS = 32
PER_THREAD = 40  # commits per thread per round
LONG_SESSION = 100_000
SQLITE_SIZES = (1_000, 10_000, 100_000)
JSONL_OPEN_RUNS = 3


# -- helpers -----------------------------------------------------------------------------------
def commit_line_size() -> int:
    """Bytes of the JSONL line (with ``\\n``) of one typical single-entry commit."""
    entry = {**commit_entry(1, "0123456789abcdef"), "seq": 12345}
    return (
        len(orjson.dumps({"gen": 1, "ops": [{"op": "entry", "lane": "main", "entry": entry}]})) + 1
    )


def fsync_floor(directory: Path, size: int, count: int) -> dict[str, Any]:
    """``count`` appends of ``size`` bytes, each followed by ``fdatasync``."""
    path = directory / f"floor-{time.monotonic_ns()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    record = b"x" * (size - 1) + b"\n"
    try:
        os.write(fd, record)
        os.fdatasync(fd)  # the file's first block and size change are not part of the loop
        lat: list[float] = []
        t0 = time.perf_counter()
        for _ in range(count):
            s = time.perf_counter()
            os.write(fd, record)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - s)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return {"commits": count, "seconds": elapsed, "latencies": lat}


def single_writer(store: Any, count: int, start: int) -> dict[str, Any]:
    """``count`` commits of one entry each on lane ``main`` (entries built beforehand)."""
    from durable_harness.storage.base import EntryOp

    parent = store.lanes()["main"].leaf_id
    ops = []
    for i in range(count):
        entry = commit_entry(start + i, parent)
        ops.append([EntryOp(entry, lane="main")])
        parent = entry["id"]
    lat: list[float] = []
    t0 = time.perf_counter()
    for op in ops:
        s = time.perf_counter()
        store.commit(op)
        lat.append(time.perf_counter() - s)
    elapsed = time.perf_counter() - t0
    return {"commits": count, "seconds": elapsed, "latencies": lat}


def multi_writer(store: Any, threads: int, per_thread: int, tag: str) -> dict[str, Any]:
    """``threads`` threads each commit ``per_thread`` entries on its own lane, each commit
    waiting for its own durability; all start together behind a barrier."""
    from durable_harness.storage.base import EntryOp

    lanes = store.lanes()
    plans: list[list[list[Any]]] = []
    for t in range(threads):
        lane = f"{tag}-w{t}"
        parent = lanes[lane].leaf_id if lane in lanes else None
        plan = []
        for i in range(per_thread):
            entry = commit_entry(t * 100_000 + i, parent)
            plan.append([EntryOp(entry, lane=lane)])
            parent = entry["id"]
        plans.append(plan)
    barrier = threading.Barrier(threads + 1)
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        mine = lat[t]
        barrier.wait()
        try:
            for op in plans[t]:
                s = time.perf_counter()
                store.commit(op)
                mine.append(time.perf_counter() - s)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    flat = [x for per in lat for x in per]
    return {"commits": threads * per_thread, "seconds": elapsed, "latencies": flat}


def async_writers(store: Any, tasks: int, per_task: int, tag: str) -> dict[str, Any]:
    """``tasks`` anyio tasks in one event loop each commit ``per_task`` entries on its own lane
    with ``commit_async``, each awaiting its own durability (group commit without a thread per
    writer: the way the harness commits)."""
    import anyio

    from durable_harness.storage.base import EntryOp

    lanes = store.lanes()
    plans: list[list[list[Any]]] = []
    for t in range(tasks):
        lane = f"{tag}-a{t}"
        parent = lanes[lane].leaf_id if lane in lanes else None
        plan = []
        for i in range(per_task):
            entry = commit_entry(t * 100_000 + i + 50_000, parent)
            plan.append([EntryOp(entry, lane=lane)])
            parent = entry["id"]
        plans.append(plan)
    lat: list[float] = []

    async def writer(plan: list[list[Any]]) -> None:
        for op in plan:
            s = time.perf_counter()
            await store.commit_async(op)
            lat.append(time.perf_counter() - s)

    async def main() -> float:
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for plan in plans:
                tg.start_soon(writer, plan)
        return time.perf_counter() - t0

    elapsed = anyio.run(main)
    return {"commits": tasks * per_task, "seconds": elapsed, "latencies": lat}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate over rounds, plus latency percentiles over all commits."""
    rates = [rate(r["commits"], r["seconds"]) for r in runs]
    lat = [x for r in runs for x in r["latencies"]]
    best = median(rates)
    return {
        "commits_per_s": round(best, 1),
        "us_per_commit": round(1e6 / best, 2) if best else None,
        "rounds_commits_per_s": [round(x, 1) for x in rates],
        "latency_us": {
            "p50": round(percentile(lat, 50) * 1e6, 1),
            "p99": round(percentile(lat, 99) * 1e6, 1),
            "max": round(max(lat) * 1e6, 1) if lat else None,
        },
        "commits": sum(r["commits"] for r in runs),
    }


# -- commit rates ------------------------------------------------------------------------------
def group_floor(directory: Path, size: int, threads: int, per_thread: int) -> dict[str, Any]:
    """The group-commit floor of plain Python: ``threads`` threads append ``size``-byte records
    under a lock and share ``fdatasync`` calls (a leader syncs everything written so far while
    the others wait; only the waiters it covers are woken). No JSON, no index, no lease."""
    path = directory / f"group-{time.monotonic_ns()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    record = b"x" * (size - 1) + b"\n"
    write_lock = threading.Lock()
    lock = threading.Lock()
    state: dict[str, Any] = {"written": 0, "synced": 0, "syncing": False, "fsyncs": 0}
    waiters: list[tuple[int, threading.Event]] = []

    def commit() -> None:
        with write_lock:
            os.write(fd, record)
            state["written"] += 1
            ticket = state["written"]
        lock.acquire()
        try:
            while state["synced"] < ticket:
                if state["syncing"]:
                    ev = threading.Event()
                    waiters.append((ticket, ev))
                    lock.release()
                    ev.wait()
                    lock.acquire()
                    continue
                state["syncing"] = True
                covered = state["written"]
                lock.release()
                os.fdatasync(fd)
                lock.acquire()
                state["fsyncs"] += 1
                state["syncing"] = False
                state["synced"] = max(state["synced"], covered)
                rest = [(t, e) for t, e in waiters if t > state["synced"]]
                for t, e in waiters:
                    if t <= state["synced"]:
                        e.set()
                if rest:  # hand the next sync to one waiter that is not covered yet
                    rest.pop(0)[1].set()
                waiters[:] = rest
        finally:
            lock.release()

    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        barrier.wait()
        for _ in range(per_thread):
            commit()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return {
        "commits": threads * per_thread,
        "seconds": elapsed,
        "latencies": [],
        "fsyncs": state["fsyncs"],
    }


class FsyncCounter:
    """Counts ``os.fdatasync`` calls made while installed (to report commits per fsync)."""

    def __init__(self) -> None:
        self.count = 0
        self._real = os.fdatasync

    def __enter__(self) -> FsyncCounter:
        real = self._real

        def counting(fd: int) -> None:
            self.count += 1
            real(fd)

        os.fdatasync = counting
        return self

    def __exit__(self, *exc: object) -> None:
        os.fdatasync = self._real


def commit_benchmarks(work: Path) -> dict[str, Any]:
    """Paired rounds: each round measures the floor and every subject once, in turn, so a
    per-round ratio compares figures taken seconds apart."""
    from durable_harness.storage import JsonlStore, SqliteStore

    size = commit_line_size()
    cwd = "/bench/project"
    jsonl = JsonlStore(work / "jsonl")
    sqlite = SqliteStore(work / "sqlite" / "bench.db")
    stores = {
        "jsonl_sync": jsonl.create_session(cwd, durability="sync"),
        "jsonl_batch": jsonl.create_session(cwd, durability="batch"),
        "sqlite_sync": sqlite.create_session(cwd, durability="sync"),
        "sqlite_batch": sqlite.create_session(cwd, durability="batch"),
    }
    multi = f"_{THREADS}threads"
    tasks = f"_{THREADS}tasks"
    runs: dict[str, list[dict[str, Any]]] = {}
    fsyncs: dict[str, int] = {}

    def add(name: str, result: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(result)

    try:
        for name, store in stores.items():  # warm-up: file blocks, code paths, lanes
            if name.endswith("batch"):
                multi_writer(store, THREADS, 5, "warm")
            else:
                single_writer(store, 50, 0)
        for r in range(ROUNDS):
            add("floor", fsync_floor(work, size, SINGLE_COMMITS))
            add("jsonl_sync", single_writer(stores["jsonl_sync"], SINGLE_COMMITS, (r + 1) * 10_000))
            g = group_floor(work, size, THREADS, PER_THREAD)
            fsyncs["group_floor"] = fsyncs.get("group_floor", 0) + g["fsyncs"]
            add("group_floor" + multi, g)
            with FsyncCounter() as fc:
                add(
                    "jsonl_batch" + multi,
                    multi_writer(stores["jsonl_batch"], THREADS, PER_THREAD, f"r{r}"),
                )
            fsyncs["jsonl_batch"] = fsyncs.get("jsonl_batch", 0) + fc.count
            with FsyncCounter() as fc:
                add(
                    "jsonl_batch" + tasks,
                    async_writers(stores["jsonl_batch"], THREADS, PER_THREAD, f"r{r}"),
                )
            fsyncs["jsonl_batch_tasks"] = fsyncs.get("jsonl_batch_tasks", 0) + fc.count
            add(
                "sqlite_sync",
                single_writer(stores["sqlite_sync"], SINGLE_COMMITS, (r + 1) * 10_000),
            )
            add(
                "sqlite_batch" + multi,
                multi_writer(stores["sqlite_batch"], THREADS, PER_THREAD, f"r{r}"),
            )
            add(
                "sqlite_batch" + tasks,
                async_writers(stores["sqlite_batch"], THREADS, PER_THREAD, f"r{r}"),
            )
            log(
                f"  round {r + 1}/{ROUNDS}: floor {_us(runs['floor'][-1])} us, jsonl sync "
                f"{_us(runs['jsonl_sync'][-1])} us, jsonl batch x{THREADS} "
                f"{_rate(runs['jsonl_batch' + multi][-1]):,.0f}/s, sqlite sync "
                f"{_us(runs['sqlite_sync'][-1])} us, sqlite batch x{THREADS} "
                f"{_rate(runs['sqlite_batch' + multi][-1]):,.0f}/s"
            )
    finally:
        for store in stores.values():
            store.close()

    # unpaired extras: no fsync at all, and sync mode under 32 threads (serialized fsyncs)
    for backend, factory in (("jsonl", jsonl), ("sqlite", sqlite)):
        with factory.create_session(cwd, durability="none") as s:
            single_writer(s, 50, 0)
            runs[f"{backend}_none"] = [
                single_writer(s, SINGLE_COMMITS * 2, (r + 1) * 10_000) for r in range(2)
            ]
            runs[f"{backend}_none" + multi] = [
                multi_writer(s, THREADS, PER_THREAD, f"n{r}") for r in range(2)
            ]
        with factory.create_session(cwd, durability="sync") as s:
            runs[f"{backend}_sync" + multi] = [multi_writer(s, THREADS, PER_THREAD // 2, "s")]

    out: dict[str, Any] = {
        "commit_line_bytes": size,
        "threads": THREADS,
        "rounds": ROUNDS,
        "single_writer_commits_per_round": SINGLE_COMMITS,
        "commits_per_thread_per_round": PER_THREAD,
    }
    for name, rs in runs.items():
        out[name] = summarize(rs)
    out["group_floor" + multi]["commits_per_fsync"] = round(
        out["group_floor" + multi]["commits"] / max(fsyncs["group_floor"], 1), 2
    )
    out["jsonl_batch" + multi]["commits_per_fsync"] = round(
        out["jsonl_batch" + multi]["commits"] / max(fsyncs["jsonl_batch"], 1), 2
    )
    out["jsonl_batch" + tasks]["commits_per_fsync"] = round(
        out["jsonl_batch" + tasks]["commits"] / max(fsyncs["jsonl_batch_tasks"], 1), 2
    )

    def paired(a: str, b: str) -> dict[str, Any]:
        per = [_rate(x) / _rate(y) for x, y in zip(runs[a], runs[b], strict=True) if _rate(y)]
        return {"median": round(median(per), 3), "rounds": [round(p, 3) for p in per]}

    out["paired_ratios"] = {
        "jsonl_sync_vs_floor": paired("jsonl_sync", "floor"),
        "jsonl_batch32_vs_jsonl_sync": paired("jsonl_batch" + multi, "jsonl_sync"),
        "jsonl_batch32tasks_vs_jsonl_sync": paired("jsonl_batch" + tasks, "jsonl_sync"),
        "group_floor32_vs_floor": paired("group_floor" + multi, "floor"),
        "jsonl_batch32_vs_group_floor32": paired("jsonl_batch" + multi, "group_floor" + multi),
        "sqlite_sync_vs_floor": paired("sqlite_sync", "floor"),
        "sqlite_batch32_vs_sqlite_sync": paired("sqlite_batch" + multi, "sqlite_sync"),
        "sqlite_batch32tasks_vs_sqlite_sync": paired("sqlite_batch" + tasks, "sqlite_sync"),
        "sqlite_sync_vs_jsonl_sync": paired("sqlite_sync", "jsonl_sync"),
    }
    return out


MARK_ROUNDS = 8
MARK_FLOOR_COMMITS = 2000


def mark_floor(directory: Path, size: int, count: int = MARK_FLOOR_COMMITS) -> dict[str, Any]:
    """The mark's marginal cost at the syscall level, interleaved commit by commit so disk
    drift hits both alike: ``pwrite`` of a line + ``fdatasync`` (what a ``sync`` commit does
    without the mark), against the same plus the mark's work (format + CRC + a 29-byte
    ``pwrite`` into line 1, whose page the same ``fdatasync`` then flushes: the store writes the
    mark after the fsync and the next commit's fsync flushes it, the same work per commit)."""
    from durable_harness.storage.jsonl import mark_text

    path = directory / f"markfloor-{time.monotonic_ns()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    record = b"x" * (size - 1) + b"\n"
    header = b"h" * 200 + b"\n"
    try:
        os.write(fd, header + b"\n" * (size * (count + 10)))  # preallocated, as the store does
        os.fdatasync(fd)
        lat: dict[str, list[float]] = {"without": [], "with": []}
        offset = len(header)
        for i in range(count):
            variant = "with" if i % 2 else "without"
            s = time.perf_counter()
            os.pwrite(fd, record, offset)
            if variant == "with":  # before the fsync here, so its page is flushed in this
                os.pwrite(fd, mark_text(i).encode(), 100)  # commit's time, not the next's
            os.fdatasync(fd)
            lat[variant].append(time.perf_counter() - s)
            offset += size
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "commits_each": count // 2,
        "us_median_without_mark": round(median(lat["without"]) * 1e6, 1),
        "us_median_with_mark": round(median(lat["with"]) * 1e6, 1),
        "us_p90_without_mark": round(percentile(lat["without"], 90) * 1e6, 1),
        "us_p90_with_mark": round(percentile(lat["with"], 90) * 1e6, 1),
    }


def mark_cost(work: Path, rounds: int = MARK_ROUNDS) -> dict[str, Any]:
    """What the JSONL high-water mark (``design/storage.md``) costs per commit: JSONL ``sync``
    single-writer commits and ``batch`` commits of 32 tasks, each with the mark and with it
    switched off (the store's private ``_mark_at`` cleared: no ``pwrite`` into line 1), in
    alternating rounds of the same run, compared by their medians. ``none`` (no fsync, the
    mark written after every commit) isolates the mark's CPU and ``pwrite`` cost from the
    disk's fsync latency."""
    from durable_harness.storage import JsonlStore

    jsonl = JsonlStore(work / "mark")
    cwd = "/bench/mark"
    stores = {
        "sync_mark": jsonl.create_session(cwd, durability="sync"),
        "sync_nomark": jsonl.create_session(cwd, durability="sync"),
        "batch_mark": jsonl.create_session(cwd, durability="batch"),
        "batch_nomark": jsonl.create_session(cwd, durability="batch"),
        "none_mark": jsonl.create_session(cwd, durability="none"),
        "none_nomark": jsonl.create_session(cwd, durability="none"),
    }
    for name, store in stores.items():
        if name.endswith("nomark"):
            store.file._mark_at = None
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, store in stores.items():  # warm-up
            if name.startswith("batch"):
                async_writers(store, THREADS, 5, "warm")
            else:
                single_writer(store, 50, 0)
        for r in range(rounds):
            order = list(stores) if r % 2 == 0 else list(reversed(stores))
            for name in order:
                store = stores[name]
                if name.startswith("batch"):
                    res = async_writers(store, THREADS, PER_THREAD, f"m{r}")
                else:
                    res = single_writer(store, SINGLE_COMMITS, (r + 1) * 10_000)
                runs.setdefault(name, []).append(res)
            log(
                f"  mark round {r + 1}/{rounds}: sync {_us(runs['sync_mark'][-1])} us with, "
                f"{_us(runs['sync_nomark'][-1])} us without; batch x{THREADS} "
                f"{_us(runs['batch_mark'][-1])} us with, {_us(runs['batch_nomark'][-1])} us "
                f"without; none {_us(runs['none_mark'][-1])} us with, "
                f"{_us(runs['none_nomark'][-1])} us without (per commit)"
            )
    finally:
        for store in stores.values():
            store.close()
    out: dict[str, Any] = {"rounds": rounds, "floor": mark_floor(work, commit_line_size())}
    for mode in ("sync", "batch", "none"):
        with_us = median([1e6 / _rate(x) for x in runs[f"{mode}_mark"]])
        without_us = median([1e6 / _rate(x) for x in runs[f"{mode}_nomark"]])
        per = [
            _rate(b) / _rate(a)
            for a, b in zip(runs[f"{mode}_mark"], runs[f"{mode}_nomark"], strict=True)
        ]
        out[mode] = {
            "us_per_commit_with_mark": round(with_us, 1),
            "us_per_commit_without_mark": round(without_us, 1),
            "cost_ratio_median": round(median(per), 3),
            "cost_ratio_rounds": [round(p, 3) for p in per],
        }
    return out


def _rate(run: dict[str, Any]) -> float:
    return rate(run["commits"], run["seconds"])


def _us(run: dict[str, Any]) -> str:
    r = _rate(run)
    return f"{1e6 / r:.0f}" if r else "-"


# -- long sessions -----------------------------------------------------------------------------
def make_jsonl_session(work: Path, n: int) -> tuple[str, float]:
    """Write an ``n``-entry session through the store (``durability="none"``, one entry per
    commit line, as the harness writes them); return its path and the seconds it took."""
    from durable_harness.storage import EntryOp, JsonlStore

    entries = long_session_entries(n)
    t0 = time.perf_counter()
    with JsonlStore(work / "long-jsonl").create_session("/bench/long", durability="none") as s:
        for e in entries:
            s.commit([EntryOp(e, lane="main")])
        path = str(s.location)
    os.sync()
    return path, time.perf_counter() - t0


def make_sqlite_session(db: Path, n: int) -> tuple[str, float]:
    """Write an ``n``-entry session into the SQLite database ``db`` (1,000 entries per
    transaction, ``durability="none"``); return its id and the seconds it took."""
    from durable_harness.storage import EntryOp, SqliteStore

    entries = long_session_entries(n)
    t0 = time.perf_counter()
    with SqliteStore(db).create_session("/bench/long", durability="none") as s:
        for i in range(0, n, 1000):
            s.commit([EntryOp(e, lane="main") for e in entries[i : i + 1000]])
        sid = s.session_id
    os.sync()
    return sid, time.perf_counter() - t0


def child_open_jsonl(path: str) -> dict[str, Any]:
    """(fresh process) Open ``path`` read-only and build the leaf's context."""
    from durable_harness.session.session import Session
    from durable_harness.storage.jsonl import JsonlSessionStore

    probe = MemoryProbe()
    probe.start()
    t0 = time.perf_counter()
    store = JsonlSessionStore.open_path(path, write=False)
    t1 = time.perf_counter()
    ctx = Session(store).context()
    t2 = time.perf_counter()
    mem = probe.stop()
    result = {
        "open_s": t1 - t0,
        "context_s": t2 - t1,
        "total_s": t2 - t0,
        "entries": store.entry_count(),
        "damage": len(store.damage),
        "context_messages": len(ctx.messages),
        "context_model": ctx.model,
        **mem,
    }
    result.update(entry_read_costs(store))
    store.close()
    return result


def entry_read_costs(store: Any, count: int = 5000) -> dict[str, Any]:
    """Per-entry read cost of ``store.get_entry`` against a raw ``pread`` + ``orjson.loads``
    of the same commit lines (JSONL), over ``count`` entries spread through the file."""
    ids = store._order[:: max(1, len(store._order) // count)][:count]
    locs = [store._meta[i][3] for i in ids]
    fd = store.file._fd
    t0 = time.perf_counter()
    for i in ids:
        store.get_entry(i)
    t1 = time.perf_counter()
    for offset, length, idx in locs:
        orjson.loads(os.pread(fd, length, offset))["ops"][idx]["entry"]
    t2 = time.perf_counter()
    n = len(ids)
    return {"get_entry_us": (t1 - t0) / n * 1e6, "raw_pread_loads_us": (t2 - t1) / n * 1e6}


def child_open_sqlite(db: str, session_id: str, repeats: int = 5) -> dict[str, Any]:
    """(fresh process) Open the store and the session, read ``lanes()`` and build the main
    leaf's context; the first time in the process, then ``repeats`` more times."""
    from durable_harness.session.context import build_context
    from durable_harness.storage import SqliteStore

    def once(write: bool) -> tuple[float, int]:
        t0 = time.perf_counter()
        store = SqliteStore(db)
        sess = store.open_session(session_id, write=write)
        leaf = sess.lanes()["main"].leaf_id
        ctx = build_context(sess.get_entry, leaf)
        elapsed = time.perf_counter() - t0
        sess.close()
        return elapsed, len(ctx.messages)

    first, messages = once(False)
    again = [once(False)[0] for _ in range(repeats)]
    rw = [once(True)[0] for _ in range(repeats)]
    return {
        "first_ms": first * 1e3,
        "median_ms": median(again) * 1e3,
        "write_open_median_ms": median(rw) * 1e3,
        "context_messages": messages,
    }


def long_session_benchmarks(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    path, gen_s = make_jsonl_session(work, LONG_SESSION)
    size = os.path.getsize(path)
    log(f"  wrote {LONG_SESSION} entries, {size / 1e6:.1f} MB in {gen_s:.1f} s")
    runs = [
        run_child("bench.bench_storage", "child_open_jsonl", {"path": path})
        for _ in range(JSONL_OPEN_RUNS)
    ]
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        out["jsonl_open"] = {"error": errors[0]}
    else:
        best = sorted(runs, key=lambda r: r["total_s"])[len(runs) // 2]
        worst_peak = max(r["peak_delta_kib"] for r in runs)
        out["jsonl_open"] = {
            "entries": LONG_SESSION,
            "file_bytes": size,
            "generate_s": round(gen_s, 2),
            "open_s": round(best["open_s"], 3),
            "context_s": round(best["context_s"], 4),
            "total_s": round(best["total_s"], 3),
            "runs_total_s": [round(r["total_s"], 3) for r in runs],
            "context_messages": best["context_messages"],
            "get_entry_us": round(best["get_entry_us"], 2),
            "raw_pread_loads_us": round(best["raw_pread_loads_us"], 2),
            "damage": best["damage"],
            "peak_rss_delta_bytes": worst_peak * 1024,
            "peak_rss_delta_vs_file": round(worst_peak * 1024 / size, 3),
            "baseline_rss_bytes": best["baseline_rss_kib"] * 1024,
            "peak_measure": "VmHWM after reset via /proc/self/clear_refs"
            if best["hwm_reset"]
            else "VmHWM (not reset: delta is a lower bound)",
            "ru_maxrss_delta_bytes": max(r["ru_maxrss_delta_kib"] for r in runs) * 1024,
            "ru_maxrss_note": "ru_maxrss of a child starts at the parent's peak (Linux keeps it "
            "across fork/exec), so its delta understates the child's growth",
            "note": "fresh process per run; page cache warm (file just written)",
        }
        log(f"  jsonl open+context {best['total_s']:.3f} s, peak +{worst_peak / 1024:.0f} MiB")
    sqlite: dict[str, Any] = {}
    for n in SQLITE_SIZES:
        db = work / f"long-sqlite-{n}" / "sessions.db"
        sid, gen_s = make_sqlite_session(db, n)
        res = run_child(
            "bench.bench_storage", "child_open_sqlite", {"db": str(db), "session_id": sid}
        )
        res["generate_s"] = round(gen_s, 2)
        res["db_bytes"] = os.path.getsize(db)
        sqlite[str(n)] = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}
        log(f"  sqlite {n}: open+lanes+context first {res.get('first_ms', float('nan')):.1f} ms")
    out["sqlite_open"] = sqlite
    return out


# -- entry point -------------------------------------------------------------------------------
def run() -> dict[str, Any]:
    """Run the storage benchmark; write ``bench/results/storage.json``; return the results."""
    with scratch_dir("storage") as work:
        results: dict[str, Any] = {
            "benchmark": "storage",
            "machine": machine_info(),
            "scratch_dir": str(work),
            "scratch_fs": fs_type(work),
        }
        log("storage: commit rates")
        c = commit_benchmarks(work)
        results["commits"] = c
        log("storage: high-water mark cost")
        results["mark_cost"] = mark_cost(work)
        log("storage: long sessions")
        results["long_sessions"] = long_session_benchmarks(work)

    multi = f"_{THREADS}threads"
    pr = {k: v["median"] for k, v in c["paired_ratios"].items()}
    sync = c["jsonl_sync"]["commits_per_s"]
    sqlite_sync = c["sqlite_sync"]["commits_per_s"]
    ratios = {
        **pr,
        "jsonl_sync32_vs_jsonl_sync": ratio(c["jsonl_sync" + multi]["commits_per_s"], sync),
        "jsonl_none_vs_jsonl_sync": ratio(c["jsonl_none"]["commits_per_s"], sync),
        "jsonl_none32_vs_jsonl_sync": ratio(c["jsonl_none" + multi]["commits_per_s"], sync),
        "sqlite_none_vs_sqlite_sync": ratio(c["sqlite_none"]["commits_per_s"], sqlite_sync),
        "sqlite_none32_vs_sqlite_sync": ratio(
            c["sqlite_none" + multi]["commits_per_s"], sqlite_sync
        ),
        "sqlite_sync32_vs_sqlite_sync": ratio(
            c["sqlite_sync" + multi]["commits_per_s"], sqlite_sync
        ),
    }
    results["ratios"] = ratios
    long = results["long_sessions"]
    jo = long.get("jsonl_open", {})
    targets = [
        target(
            ratios["jsonl_sync_vs_floor"],
            ">=",
            0.8,
            "JSONL sync commits/s vs fsync floor (median of paired rounds)",
        ),
        target(
            ratios["jsonl_batch32tasks_vs_jsonl_sync"],
            ">=",
            8.0,
            f"JSONL batch ({THREADS} async writers, commit_async) commits/s vs JSONL sync",
        ),
        target(jo.get("total_s"), "<", 1.5, "JSONL 100k open + context (s)"),
        target(jo.get("peak_rss_delta_vs_file"), "<", 4.0, "JSONL 100k peak RSS delta / file"),
    ]
    for n, res in long.get("sqlite_open", {}).items():
        targets.append(
            target(
                res.get("first_ms"),
                "<",
                50.0,
                f"SQLite {n} open + lanes + context (ms, first in process)",
            )
        )
    results["load_at_end"] = load_snapshot()
    results["targets"] = targets
    write_results("storage", results)

    def row(label: str, key: str, unit: str, note: str) -> tuple[str, Any, str, str]:
        fig = c[key]
        value = fig["us_per_commit"] if unit == "us/commit" else fig["commits_per_s"]
        return (label, value, unit, note)

    rows = [
        row(
            "fsync floor (write+fdatasync)",
            "floor",
            "us/commit",
            f"{c['floor']['commits_per_s']:,.0f}/s; rounds {c['floor']['rounds_commits_per_s']}",
        ),
        row(
            "JSONL sync",
            "jsonl_sync",
            "us/commit",
            f"{sync:,.0f}/s; {ratios['jsonl_sync_vs_floor']}x floor",
        ),
        row(
            f"Python group-commit floor x{THREADS}",
            "group_floor" + multi,
            "commits/s",
            f"{ratios['group_floor32_vs_floor']}x floor; "
            f"{c['group_floor' + multi]['commits_per_fsync']} commits/fsync",
        ),
        row(
            f"JSONL batch x{THREADS}",
            "jsonl_batch" + multi,
            "commits/s",
            f"{ratios['jsonl_batch32_vs_jsonl_sync']}x sync; "
            f"{ratios['jsonl_batch32_vs_group_floor32']}x group floor; "
            f"{c['jsonl_batch' + multi]['commits_per_fsync']} commits/fsync",
        ),
        row(
            f"JSONL sync x{THREADS}",
            "jsonl_sync" + multi,
            "commits/s",
            f"{ratios['jsonl_sync32_vs_jsonl_sync']}x sync",
        ),
        row(
            "JSONL none x1",
            "jsonl_none",
            "commits/s",
            f"{ratios['jsonl_none_vs_jsonl_sync']}x sync",
        ),
        row(
            f"JSONL none x{THREADS}",
            "jsonl_none" + multi,
            "commits/s",
            f"{ratios['jsonl_none32_vs_jsonl_sync']}x sync",
        ),
        row(
            f"JSONL batch x{THREADS} async tasks",
            "jsonl_batch" + f"_{THREADS}tasks",
            "commits/s",
            f"{ratios['jsonl_batch32tasks_vs_jsonl_sync']}x sync; "
            f"{c['jsonl_batch' + f'_{THREADS}tasks'].get('commits_per_fsync')} commits per fsync",
        ),
        row(
            "SQLite sync",
            "sqlite_sync",
            "us/commit",
            f"{sqlite_sync:,.0f}/s; {ratios['sqlite_sync_vs_floor']}x floor",
        ),
        row(
            f"SQLite batch x{THREADS}",
            "sqlite_batch" + multi,
            "commits/s",
            f"{ratios['sqlite_batch32_vs_sqlite_sync']}x SQLite sync",
        ),
        row(
            f"SQLite batch x{THREADS} async tasks",
            "sqlite_batch" + f"_{THREADS}tasks",
            "commits/s",
            f"{ratios['sqlite_batch32tasks_vs_sqlite_sync']}x SQLite sync",
        ),
        row(
            f"SQLite sync x{THREADS}",
            "sqlite_sync" + multi,
            "commits/s",
            f"{ratios['sqlite_sync32_vs_sqlite_sync']}x SQLite sync",
        ),
        row(
            "SQLite none x1",
            "sqlite_none",
            "commits/s",
            f"{ratios['sqlite_none_vs_sqlite_sync']}x SQLite sync",
        ),
        row(
            f"SQLite none x{THREADS}",
            "sqlite_none" + multi,
            "commits/s",
            f"{ratios['sqlite_none32_vs_sqlite_sync']}x SQLite sync",
        ),
        (
            "JSONL 100k open+context",
            jo.get("total_s"),
            "s",
            jo.get("error")
            or f"open {jo.get('open_s')} s + context {jo.get('context_s')} s; "
            f"peak +{jo.get('peak_rss_delta_vs_file')}x file "
            f"({jo.get('file_bytes', 0) / 1e6:.0f} MB)",
        ),
    ]
    for n, res in long.get("sqlite_open", {}).items():
        rows.append(
            (
                f"SQLite {n} open+lanes+context",
                res.get("first_ms"),
                "ms",
                f"warm median {res.get('median_ms')} ms, write-open "
                f"{res.get('write_open_median_ms')} ms"
                if "error" not in res
                else res["error"],
            )
        )
    results["summary_rows"] = rows
    return results


CHILDREN = {"child_open_jsonl": child_open_jsonl, "child_open_sqlite": child_open_sqlite}

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(CHILDREN)
    elif len(sys.argv) > 1 and sys.argv[1] == "mark":  # only the mark's cost
        with scratch_dir("storage-mark") as work:
            print(orjson.dumps(mark_cost(work), option=orjson.OPT_INDENT_2).decode())
    else:
        run()
