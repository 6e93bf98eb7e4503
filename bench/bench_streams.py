"""Streams benchmark: readers do not slow writers (issue 22).

A real ``durable-harness serve`` (a child process, ``--port 0``) on a ``jsonl:`` store, one
session running a scripted multi-turn run (``TOOL_TURNS`` turns each calling the replay-safe
``read_file`` and streaming its text in ``CHUNKS`` deltas, then a final answer), timed in
phases that alternate in one run:

* **none**: no event stream open;
* **streams**: ``MAX_EVENT_STREAMS`` (256, the cap) event streams open on that session, held
  by a separate reader process of real HTTP clients (``httpx``): ``READING`` of them read
  everything (and count what they got), the rest never read a byte after the headers.

A run is timed from its ``send`` until ``GET .../agent/status`` shows the lane's run closed
(polled every ``POLL_S``; the same poll in both phases). Reported: turns per second in each
phase (over all its repetitions) and the server's CPU per turn (``/proc``: a steadier
figure than the wall time on a shared machine; with the streams open it runs until every
reading stream has received every run's ``run_end``, so work left for after the timed runs
is counted too), the reader process's CPU per turn during the timed runs (it shares the
machine's cores with the server), the ratio of the times (goal <= 1.5x: a run with the
streams open takes at most 1.5 times as long), what the readers received, and how many
streams were still open at the end (a reader that fell behind is dropped: ``design/http.md``,
"Events").

``--quick`` or ``DH_BENCH_QUICK=1``: fewer runs. ``DH_BENCH_STREAMS_PROFILE=FILE``: the server
runs under ``cProfile`` (written to ``FILE`` when it stops).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    REPO_ROOT,
    fs_type,
    load_snapshot,
    log,
    machine_info,
    rate,
    ratio,
    scratch_dir,
    target,
    write_results,
)

TOOL_TURNS = 4
CHUNKS = 8
STREAMS = 256  # durable_harness.http.streams.MAX_EVENT_STREAMS, the cap
READING = 64
POLL_S = 0.005
FULL = {"runs": 40, "reps": 3}
QUICK = {"runs": 3, "reps": 1}
WORK_PROMPT = "work"
START_TIMEOUT = 60.0
CATCH_UP_TIMEOUT = 60.0
RUN_END = b"\nevent: run_end\r\n"


def quick() -> bool:
    """Whether the small numbers are asked for (``DH_BENCH_QUICK`` set and not ``0``)."""
    return os.environ.get("DH_BENCH_QUICK", "0") not in ("", "0")


def script() -> dict[str, Any]:
    """The scripted provider's file: the work run (``TOOL_TURNS`` tool turns, then an answer)."""
    turns: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: reading the notes file once more to be sure of it.",
            "chunks": CHUNKS,
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
            "usage": {"input": 100 + i, "output": 10},
        }
        for i in range(TOOL_TURNS)
    ]
    turns.append({"text": "All read; nothing changed.", "chunks": CHUNKS})
    return {"turns": [{"text": "unscripted"}], "by_prompt": {WORK_PROMPT: turns}}


class _Serve:
    """``durable-harness serve --port 0`` as a child (under cProfile when asked)."""

    def __init__(self, store: str, home: Path, profile: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS")}
        env["DURABLE_HARNESS_HOME"] = str(home)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        home.mkdir(parents=True, exist_ok=True)
        prefix = ["-m", "cProfile", "-o", profile] if profile else []
        argv = [sys.executable, *prefix, "-m", "durable_harness", "serve", "--port", "0"]
        self.log = home / "serve.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [*argv, "--store", store], env=env, stdout=subprocess.PIPE, stderr=err
            )
        self.profiled = bool(profile)
        self.url = self._url()

    def _url(self) -> str:
        assert self.proc.stdout is not None
        deadline, buf = time.monotonic() + START_TIMEOUT, b""
        while time.monotonic() < deadline and self.proc.poll() is None:
            if select.select([self.proc.stdout], [], [], 0.1)[0]:
                buf += os.read(self.proc.stdout.fileno(), 4096)
                text = buf.decode(errors="replace")
                if "serving on " in text:
                    return text.split("serving on ", 1)[1].split()[0]
        self.proc.kill()
        raise RuntimeError(f"serve did not start: {buf!r} {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM and wait; SIGINT under cProfile (uvicorn re-raises the signal once it has
        stopped: a KeyboardInterrupt still lets cProfile write its file, a SIGTERM does not)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT if self.profiled else signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cpu_seconds(pid: int, which: str = "both") -> float:
    """CPU seconds of process ``pid`` so far (``/proc/PID/stat``): ``user``, ``system`` or
    ``both``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    user, system = int(fields[11]), int(fields[12])
    ticks = {"user": user, "system": system, "both": user + system}[which]
    return ticks / os.sysconf("SC_CLK_TCK")


def _timed_runs(client: httpx.Client, sid: str, runs: int) -> float:
    """Seconds for ``runs`` work runs back to back, each from its send to its close."""
    t0 = time.perf_counter()
    for _ in range(runs):
        resp = client.post(f"/sessions/{sid}/agent/send", json={"message": WORK_PROMPT})
        resp.raise_for_status()
        run_id = resp.json()["run_id"]
        while True:
            lanes = client.get(f"/sessions/{sid}/agent/status").json()["lanes"]
            if all(lane["run_id"] != run_id for lane in lanes):
                break
            time.sleep(POLL_S)
    return time.perf_counter() - t0


class _Readers:
    """The reader process: ``STREAMS`` event streams open on the session."""

    def __init__(self, url: str, sid: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        spec = json.dumps({"url": url, "sid": sid, "streams": STREAMS, "reading": READING})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_streams", "--readers", spec],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.proc.kill()
            raise RuntimeError(f"the readers did not open their streams: {line!r}")

    def caught_up(self, runs: int) -> float:
        """Wait until every reading stream has seen ``runs`` ``run_end`` events since it
        opened (at most ``CATCH_UP_TIMEOUT``); the seconds that took."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{runs}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line.startswith("CAUGHT"):
            raise RuntimeError(f"the readers did not report: {line!r}")
        return float(line.split()[1])

    def stop(self) -> dict[str, Any]:
        """Close every stream; what the readers got."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result


async def _reader_main(url: str, sid: str, streams: int, reading: int) -> dict[str, Any]:
    """Open ``streams`` event streams (retrying a 503 while earlier ones are let go); the
    first ``reading`` read everything; print ``READY`` once all are open; on a line ``N`` on
    stdin, print ``CAUGHT SECONDS`` once every reading stream has seen ``N`` ``run_end``
    events (or after ``CATCH_UP_TIMEOUT``); stop on SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    opened = 0
    all_open = asyncio.Event()
    got = {"bytes": 0, "events": 0, "ended_by_server": 0}
    run_ends = [0] * reading
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    path = f"/sessions/{sid}/agent/events"

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal opened
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            async with client.stream("GET", path) as resp:
                if resp.status_code == 503 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                resp.raise_for_status()
                opened += 1
                if opened == streams:
                    all_open.set()
                if index >= reading:
                    await stop.wait()  # never reads a byte of the body
                    return
                tail = b""
                async for chunk in resp.aiter_raw():  # counted across chunk boundaries
                    got["bytes"] += len(chunk)
                    buf = tail + chunk
                    got["events"] += buf.count(b"event: ")
                    run_ends[index] += buf.count(RUN_END)
                    tail = buf[-(len(RUN_END) - 1) :]
                got["ended_by_server"] += 1
                return

    async def catch_up() -> None:
        while not stop.is_set():
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            t0 = time.monotonic()
            while min(run_ends) < int(line) and time.monotonic() - t0 < CATCH_UP_TIMEOUT:
                await asyncio.sleep(0.01)
            print(f"CAUGHT {time.monotonic() - t0:.3f} {min(run_ends)}", flush=True)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=None) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(streams)]
        await all_open.wait()
        print("READY", flush=True)
        tasks.append(asyncio.create_task(catch_up()))
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"opened": opened, "reading": reading, "min_run_ends": min(run_ends, default=0), **got}


def run() -> dict[str, Any]:
    """Run the streams benchmark; write ``bench/results/streams.json``; return the results."""
    sizes = QUICK if quick() else FULL
    results: dict[str, Any] = {"benchmark": "streams", "machine": machine_info(), "quick": quick()}
    log(f"streams: load at start {results['machine']['load_at_start'].get('loadavg')}")
    with scratch_dir("streams") as work:
        cwd = work / "cwd"
        cwd.mkdir()
        (cwd / "notes.txt").write_text("the notes\n" * 20)
        script_path = work / "script.json"
        script_path.write_text(json.dumps(script()))
        results["scratch_fs"] = fs_type(work)
        server = _Serve(
            f"jsonl:{work / 'store'}", work / "home", os.environ.get("DH_BENCH_STREAMS_PROFILE")
        )
        try:
            with httpx.Client(base_url=server.url, timeout=60.0) as client:
                resp = client.post(
                    "/sessions", json={"cwd": str(cwd), "provider": f"scripted:{script_path}"}
                )
                resp.raise_for_status()
                sid = resp.json()["id"]
                _timed_runs(client, sid, 1)  # warm-up
                seconds = {"none": 0.0, "streams": 0.0}
                cpu = {
                    "none": 0.0,
                    "none_system": 0.0,
                    "streams": 0.0,
                    "streams_system": 0.0,
                    "readers": 0.0,
                }
                readers: list[dict[str, Any]] = []
                catch_up: list[float] = []
                pid = server.proc.pid
                for rep in range(sizes["reps"]):
                    log(f"streams: repetition {rep + 1}/{sizes['reps']}: no stream open")
                    before, sys_before = cpu_seconds(pid), cpu_seconds(pid, "system")
                    seconds["none"] += _timed_runs(client, sid, sizes["runs"])
                    cpu["none"] += cpu_seconds(pid) - before
                    cpu["none_system"] += cpu_seconds(pid, "system") - sys_before
                    log(f"streams: repetition {rep + 1}/{sizes['reps']}: {STREAMS} streams open")
                    pool = _Readers(server.url, sid)
                    try:
                        before, sys_before = cpu_seconds(pid), cpu_seconds(pid, "system")
                        readers_before = cpu_seconds(pool.proc.pid)
                        seconds["streams"] += _timed_runs(client, sid, sizes["runs"])
                        cpu["readers"] += cpu_seconds(pool.proc.pid) - readers_before
                        catch_up.append(pool.caught_up(sizes["runs"]))
                        cpu["streams"] += cpu_seconds(pid) - before
                        cpu["streams_system"] += cpu_seconds(pid, "system") - sys_before
                    finally:
                        readers.append(pool.stop())
        finally:
            server.stop()
    turns = sizes["runs"] * sizes["reps"] * (TOOL_TURNS + 1)
    per_s = {k: rate(turns, v) for k, v in seconds.items()}
    cpu_per_turn_ms = {k: round(v / turns * 1000, 3) for k, v in cpu.items()}
    slowdown = ratio(seconds["streams"], seconds["none"])
    results.update(
        {
            "turns_per_phase": turns,
            "turns_per_run": TOOL_TURNS + 1,
            "runs_per_repetition": sizes["runs"],
            "seconds": seconds,
            "turns_per_s": per_s,
            "server_cpu_per_turn_ms": cpu_per_turn_ms,
            "slowdown_streams_vs_none": slowdown,
            "readers": readers,
            "readers_caught_up_after_s": catch_up,
            "load_at_end": load_snapshot(),
        }
    )
    log(f"streams: load at end {results['load_at_end'].get('loadavg')}")
    got = readers[-1] if readers else {}
    results["targets"] = [
        target(slowdown, "<=", 1.5, f"a run with {STREAMS} streams open vs none, time ratio")
    ]
    results["summary_rows"] = [
        (
            "no stream open",
            per_s["none"],
            "turns/s",
            f"{turns} turns; server CPU {cpu_per_turn_ms['none']} ms per turn "
            f"({cpu_per_turn_ms['none_system']} in the kernel)",
        ),
        (
            f"{STREAMS} streams open",
            per_s["streams"],
            "turns/s",
            f"{slowdown}x the time; server CPU {cpu_per_turn_ms['streams']} ms per turn "
            f"({cpu_per_turn_ms['streams_system']} in the kernel), the readers' process "
            f"{cpu_per_turn_ms['readers']} ms per turn during the runs; {READING} reading "
            f"({got.get('events')} events, "
            f"{got.get('bytes')} bytes, every run's end by {got.get('min_run_ends')} of "
            f"{sizes['runs']} in the last repetition, caught up "
            f"{max(catch_up, default=None)} s after it), the rest never reading",
        ),
    ]
    write_results("streams", results)
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--readers":
        spec = json.loads(sys.argv[2])
        out = asyncio.run(_reader_main(spec["url"], spec["sid"], spec["streams"], spec["reading"]))
        print(json.dumps(out), flush=True)
    else:
        print(json.dumps(run(), indent=2, default=str))
