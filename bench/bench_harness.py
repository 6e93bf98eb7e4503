"""Harness benchmark: the per-turn cost of the durable run loop, and the same loop elsewhere.

The workload is one run of ``N_TURNS`` turns, each an assistant message (from the scripted
provider) with one call of a trivial ``echo`` tool, then a final answer. Measured in one run:

* **baseline**: the same loop as plain async function calls (provider stream, tool execute,
  messages kept in a list), no storage at all; then **side by side** (issue 22's ratio), after
  one warm-up run of each, in a fresh process, ``SIDE_ROUNDS`` rounds of (baseline, ours on
  memory uninstrumented), each from a full collection, the median of the per-round ratios of
  CPU (process time: what a loaded machine does not inflate as much as wall time) and of wall
  time;
* **ours**: :class:`~durable_harness.harness.harness.Harness` on the memory backend (the loop's
  own logic, no I/O), then JSONL and SQLite in each durability mode (``sync``, ``batch``,
  ``none``); per turn, and the cost of one durable tool call (``tool_started`` intent, tool,
  result entry + ``tool_finished`` settlement: 2 commits) against 2 raw ``fdatasync`` calls
  of a commit-sized record taken just before each call (in a second run, so the per-turn
  figure of the first stays unperturbed);
* **LangGraph** (if ``langgraph`` and ``langgraph.checkpoint.sqlite`` import): a graph of the
  same shape (a ``model`` node, a ``tool`` node, looping ``N_TURNS`` times, messages in state)
  invoked with ``durability="sync"`` and a ``SqliteSaver`` checkpointer;
* **DBOS** (if ``dbos`` imports): a workflow with a SQLite system database, two steps per turn.

Competitors run in fresh subprocesses (their global state stays out of ours); a missing library
or a failure to start is recorded as ``skipped: <reason>``.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench.common import (
    child_main,
    fs_type,
    load_snapshot,
    log,
    machine_info,
    median,
    percentile,
    ratio,
    run_child,
    scratch_dir,
    target,
    write_results,
)
from bench.workload import EchoTool

N_TURNS = 200
PAIRED_TURNS = 100  # turns of the runs that pair each tool call with 2 raw fsyncs
FLOOR_SAMPLES = 100  # raw fsyncs measured before and after each durable run
WARM_TURNS = 3
"""Turns of the untimed warm-up run each contender makes before its timed one."""
VS_ROUNDS = 3  # rounds of (ours, LangGraph, DBOS), each in a fresh process
STREAM_TURNS, STREAM_DELTAS = 50, 1000  # the side-by-side run with long streamed answers
STRACE_TURNS = (10, 30)  # fsyncs per turn = difference of the counts of two runs / 20
OUR_CONFIGS = [
    ("memory", "none"),
    ("jsonl", "sync"),
    ("jsonl", "batch"),
    ("jsonl", "none"),
    ("sqlite", "sync"),
    ("sqlite", "batch"),
    ("sqlite", "none"),
]
CHILD_TIMEOUT = 180.0


def script(n: int, deltas: int | None = None) -> list[dict[str, Any]]:
    """``n`` turns each calling ``echo`` once, then a final text answer; with ``deltas``, each
    turn's text is streamed in that many deltas of 5 characters (a long answer from a real
    provider) instead of the scripted provider's 2."""
    turns: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: checking the next item.",
            "tool_calls": [{"name": "echo", "arguments": {"text": f"item {i}"}}],
            "usage": {"input": 100 + i, "output": 12},
        }
        for i in range(n)
    ]
    if deltas:
        for turn in turns:
            turn.update(text="word " * deltas, chunks=deltas)
    turns.append({"text": "All items checked.", "usage": {"input": 100 + n, "output": 5}})
    return turns


def fsync_latencies(directory: Path, size: int, count: int) -> list[float]:
    """Latencies (s) of ``count`` append + ``fdatasync`` of ``size``-byte records."""
    path = directory / f"floor-{time.monotonic_ns()}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    record = b"x" * (size - 1) + b"\n"
    out = []
    try:
        os.write(fd, record)
        os.fdatasync(fd)
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, record)
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return out


# -- the baseline: plain async calls -----------------------------------------------------------
async def plain_loop(n: int, deltas: int | None = None) -> dict[str, Any]:
    """The run loop without storage: stream each turn, run its tool calls, keep messages."""
    from durable_harness.providers.base import Done, ProviderRequest
    from durable_harness.providers.scripted import ScriptedProvider
    from durable_harness.tools.base import ToolContext

    provider = ScriptedProvider(script(n, deltas))
    tool = EchoTool()
    specs = [tool.spec()]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "check every item"}]}
    ]
    t0 = time.perf_counter()
    c0 = time.process_time()
    turn = 0
    while True:
        turn += 1
        request = ProviderRequest(
            messages=list(messages), tools=specs, model=provider.model, run_id="plain", turn=turn
        )
        message: dict[str, Any] = {}
        async for event in provider.stream(request):
            if isinstance(event, Done):
                message = event.message
        messages.append(message)
        calls = [b for b in message["content"] if b.get("type") == "toolCall"]
        if not calls:
            break
        for call in calls:
            ctx = ToolContext(
                cwd=Path("."),
                run_id="plain",
                tool_call_id=call["id"],
                idempotency_key=f"plain:{call['id']}",
            )
            result = await tool.execute(tool.parse_args(call["arguments"]), ctx)
            messages.append(
                {
                    "role": "toolResult",
                    "toolCallId": call["id"],
                    "toolName": call["name"],
                    "content": result.content,
                    "isError": result.is_error,
                }
            )
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "turns": turn - 1,
        "seconds": elapsed,
        "us_per_turn": elapsed / n * 1e6,
        "cpu_us_per_turn": cpu / n * 1e6,
    }


# -- ours --------------------------------------------------------------------------------------
def _open_session(backend: str, mode: str, work: Path) -> Any:
    from durable_harness.session.session import Session
    from durable_harness.storage import JsonlStore, MemorySessionStore, SqliteStore
    from durable_harness.storage.base import Durability

    durability: Durability = "sync" if mode == "sync" else "batch" if mode == "batch" else "none"
    if backend == "memory":
        return Session(MemorySessionStore({"id": "bench-memory", "cwd": str(work)}))
    if backend == "jsonl":
        return Session(JsonlStore(work / "jsonl").create_session(str(work), durability=durability))
    if backend == "postgres":  # bench/bench_postgres.py names the server
        from durable_harness.storage import open_store

        store = open_store(os.environ["DH_BENCH_PG"])
        return Session(store.create_session(str(work), durability=durability))
    return Session(
        SqliteStore(work / "sqlite" / "h.db").create_session(str(work), durability=durability)
    )


async def harness_run(
    session: Any,
    n: int,
    pair_dir: Path | None = None,
    *,
    instrument: bool = True,
    deltas: int | None = None,
) -> dict[str, Any]:
    """One run of ``n`` tool turns through the Harness, instrumented from outside: each
    ``store.commit`` and each tool call (the harness's ``_run_tool``) is timed. With
    ``instrument=False`` only the run is timed, as the competitors are (no wrapper adds its
    own cost to the per-turn figure).

    With ``pair_dir``, each tool call is preceded by 2 raw append + ``fdatasync`` calls of a
    commit-sized record to a file there, timed apart: a floor taken at the same moment as the
    call it is compared with (so the per-turn time of such a run is not reported)."""
    from durable_harness.harness.harness import Harness, HarnessOptions
    from durable_harness.providers.scripted import ScriptedProvider
    from durable_harness.storage.base import RecordOp

    store = session.store
    commit_times: dict[str, list[float]] = {}
    real_commit = store.commit
    context_times: list[float] = []
    real_context = session.context

    def timed_context(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        ctx = real_context(*args, **kwargs)
        context_times.append(time.perf_counter() - t0)
        return ctx

    def timed_commit(ops: list[Any], *args: Any, **kwargs: Any) -> int:
        kinds = [op.record["type"] for op in ops if isinstance(op, RecordOp)] or ["entry"]
        t0 = time.perf_counter()
        seq: int = real_commit(ops, *args, **kwargs)
        commit_times.setdefault("+".join(kinds), []).append(time.perf_counter() - t0)
        return seq

    if instrument:
        store.commit = timed_commit
        session.context = timed_context
    harness = Harness(
        session,
        ScriptedProvider(script(n, deltas)),
        [EchoTool()],
        options=HarnessOptions(max_turns=n + 5),
    )
    tool_times: list[float] = []
    pair_times: list[float] = []
    real_run_tool = harness.tool_calls.run_tool
    pair_fd = None
    if pair_dir is not None:
        from bench.bench_storage import commit_line_size

        pair_fd = os.open(pair_dir / "pair.bin", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        record = b"x" * (commit_line_size() - 1) + b"\n"

    async def timed_run_tool(live: Any, call: Any) -> None:
        if pair_fd is not None:
            t0 = time.perf_counter()
            for _ in range(2):
                os.write(pair_fd, record)
                os.fdatasync(pair_fd)
            pair_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await real_run_tool(live, call)
        tool_times.append(time.perf_counter() - t0)

    if instrument:
        harness.tool_calls.run_tool = timed_run_tool  # type: ignore[method-assign]
    turn_starts: list[float] = []
    harness.subscribe(
        lambda e: turn_starts.append(time.perf_counter()) if e["type"] == "turn_start" else None
    )
    async with harness:
        t0 = time.perf_counter()
        c0 = time.process_time()
        handle = await harness.prompt("check every item")
        outcome = await handle.wait()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
    store.commit = real_commit
    session.context = real_context
    if pair_fd is not None:
        os.close(pair_fd)
    gaps = [b - a for a, b in itertools.pairwise(turn_starts)]
    k = max(1, min(20, len(gaps) // 4))
    if not instrument:
        return {
            "outcome": outcome,
            "turns": len(turn_starts),
            "seconds": elapsed,
            "us_per_turn": elapsed / n * 1e6,
            "cpu_us_per_turn": cpu / n * 1e6,
            "first_turns_us": median(gaps[:k]) * 1e6 if gaps else None,
            "last_turns_us": median(gaps[-k:]) * 1e6 if gaps else None,
            "entries": store.entry_count(),
        }
    commits = sum(len(v) for v in commit_times.values())
    tool_commits = sum(
        median(v) for kind, v in commit_times.items() if kind in ("tool_started", "tool_finished")
    )
    paired: dict[str, Any] = {}
    if pair_times:
        per_call = [t / p for t, p in zip(tool_times, pair_times, strict=False) if p]
        paired["paired"] = {
            "two_fsyncs_us_median": median(pair_times) * 1e6,
            "tool_call_us_median": median(tool_times) * 1e6,
            "tool_call_vs_2_fsyncs": ratio(median(tool_times), median(pair_times)),
            "per_call_ratio_median": round(median(per_call), 3),
        }
    return {
        "outcome": outcome,
        "turns": len(turn_starts),
        "seconds": elapsed,
        "us_per_turn": elapsed / n * 1e6,
        "commits": commits,
        "commits_per_turn": round(commits / n, 2),
        "tool_call_us_median": median(tool_times) * 1e6,
        "tool_call_us_p90": percentile(tool_times, 90) * 1e6,
        "commit_us_median": {k2: round(median(v) * 1e6, 1) for k2, v in commit_times.items()},
        "first_turns_us": median(gaps[:k]) * 1e6 if gaps else None,
        "last_turns_us": median(gaps[-k:]) * 1e6 if gaps else None,
        "entries": store.entry_count(),
        "context_builds_per_turn": round(len(context_times) / n, 2),
        "context_us_per_turn": sum(context_times) / n * 1e6,
        "context_share_of_turn": round(sum(context_times) / elapsed, 3),
        "tool_commits_us": tool_commits * 1e6,
        **paired,
    }


SIDE_ROUNDS = 5  # rounds of (plain loop, ours on memory) in the side-by-side child


def child_plain_vs_memory(workdir: str, n: int, deltas: int | None = None) -> dict[str, Any]:
    """(fresh process) The loop's own CPU, side by side: after one uncounted warm-up run of
    each (first calls and lazy imports stay out, as the competitors' warm-ups do),
    ``SIDE_ROUNDS`` rounds of (plain async loop, ours on the memory backend uninstrumented);
    the ratio is taken within each round, then the median across rounds (issue 22: at most 4x).
    ``deltas``: each answer streamed in that many deltas (:func:`script`), both loops alike.

    Each timed run starts from a full collection (``gc.collect()``; the collector stays on):
    otherwise the run that happens to cross the oldest generation's threshold pays for a walk
    of every object the process holds, one round in three here (design/architecture.md,
    "Suite time, sixth pass": measured in the benchmark's own process after ``storage``, both
    loops ran 1.7x slower than in a fresh one, so this runs in a fresh process of its own)."""
    import gc

    import anyio

    work = Path(workdir)

    def memory_run(tag: str, turns: int) -> dict[str, Any]:
        sub = work / f"memory-{tag}"
        sub.mkdir()
        session = _open_session("memory", "none", sub)
        try:
            gc.collect()
            res = anyio.run(
                functools.partial(harness_run, session, turns, instrument=False, deltas=deltas)
            )
        finally:
            session.close()
        return res

    def plain_run(turns: int) -> dict[str, Any]:
        gc.collect()
        return anyio.run(plain_loop, turns, deltas)

    plain_run(20)
    memory_run("warm", 20)
    plain: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    for r in range(SIDE_ROUNDS):
        plain.append(plain_run(n))
        memory.append(memory_run(f"r{r}", n))
    out: dict[str, Any] = {}
    for key, name in (("cpu_us_per_turn", "cpu"), ("us_per_turn", "wall")):
        per = [m[key] / p[key] for m, p in zip(memory, plain, strict=True) if p[key]]
        out[f"{name}_plain_us_per_turn"] = round(median([p[key] for p in plain]), 1)
        out[f"{name}_memory_us_per_turn"] = round(median([m[key] for m in memory]), 1)
        out[f"{name}_memory_vs_plain"] = round(median(per), 3)
        out[f"{name}_memory_vs_plain_rounds"] = [round(x, 3) for x in per]
    return out


def plain_vs_memory(work: Path, n: int, deltas: int | None = None) -> dict[str, Any]:
    """:func:`child_plain_vs_memory` in a fresh process with its own scratch directory.

    Raises:
        RuntimeError: the child failed (its error is in the message).
    """
    sub = work / f"side-by-side-{deltas or 2}"
    sub.mkdir()
    out = run_child(
        "bench.bench_harness",
        "child_plain_vs_memory",
        {"workdir": str(sub), "n": n, "deltas": deltas},
        timeout=CHILD_TIMEOUT,
    )
    if "error" in out:
        raise RuntimeError(f"side-by-side child failed: {out['error']}")
    log(
        f"  side by side (fresh process, warm, {deltas or 2} deltas an answer): memory vs "
        f"plain, CPU "
        f"{out['cpu_memory_vs_plain']}x ({out['cpu_memory_us_per_turn']:,.0f} vs "
        f"{out['cpu_plain_us_per_turn']} us/turn), wall {out['wall_memory_vs_plain']}x"
    )
    return out


def ours(work: Path, n: int) -> dict[str, Any]:
    """Every configuration of ours in this process: a plain timed run, then (durable modes) a
    run pairing each tool call with 2 raw fsyncs."""
    import anyio

    from bench.bench_storage import commit_line_size

    size = commit_line_size()
    out: dict[str, Any] = {}
    for backend, mode in OUR_CONFIGS:
        name = f"{backend}_{mode}" if backend != "memory" else "memory"
        sub = work / name
        sub.mkdir()
        durable = backend != "memory" and mode != "none"
        before = fsync_latencies(sub, size, FLOOR_SAMPLES) if durable else []
        session = _open_session(backend, mode, sub)
        try:
            res = anyio.run(harness_run, session, n)
            if backend == "sqlite":
                wal = _wal_per_turn(session, n)
                if wal is not None:
                    res["wal_frames_per_turn"], res["wal_bytes_per_turn"] = wal
        finally:
            session.close()
        after = fsync_latencies(sub, size, FLOOR_SAMPLES) if durable else []
        if durable:
            res["fsync_floor_us_before_after"] = [median(before) * 1e6, median(after) * 1e6]
            (sub / "paired").mkdir()
            session = _open_session(backend, mode, sub / "paired")
            try:
                paired = anyio.run(harness_run, session, PAIRED_TURNS, sub / "paired")
            finally:
                session.close()
            res["paired"] = paired["paired"]
            res["paired"]["turns"] = PAIRED_TURNS
        out[name] = _rounded(res)
        extra = (
            f", tool call {res['paired']['tool_call_vs_2_fsyncs']}x 2 fsyncs"
            if "paired" in res
            else ""
        )
        log(
            f"  ours {name}: {res['us_per_turn']:,.0f} us/turn (turns 1-20 "
            f"{res['first_turns_us']:,.0f}, last 20 {res['last_turns_us']:,.0f}){extra}"
        )
    return out


def _wal_per_turn(session: Any, n: int) -> tuple[float, int] | None:
    """WAL frames (pages) and bytes the run of ``n`` turns wrote to a fresh SQLite store, per
    turn, from the end of the ``-wal`` file's last commit frame (SQLite's format: a 32-byte
    header, then a 24-byte header and a page per frame; a prefill's zeros past it do not count);
    ``None`` if a checkpoint started the WAL again meanwhile.
    Deterministic for a given schema, page size and workload, unlike the times beside it
    (``design/storage.md``, "Ids and pages" and "Page size")."""
    shared = session.store._shared
    checkpointer = shared.checkpointer
    if checkpointer is not None and (checkpointer.checkpoints or checkpointer.restarts):
        return None
    page = int(shared.reader.execute("PRAGMA page_size").fetchone()[0])
    from durable_harness.storage.barrier_trace import wal_commit_end

    size, _ = wal_commit_end(shared.wal_path)
    if not size:
        return None
    return round((size - 32) / (page + 24) / n, 1), round((size - 32) / n)


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _rounded(v)
        if isinstance(v, dict)
        else round(v, 2)
        if isinstance(v, float)
        else [round(x, 2) for x in v]
        if isinstance(v, list) and v and isinstance(v[0], float)
        else v
        for k, v in d.items()
    }


def child_ours(workdir: str, n: int, backend: str, mode: str) -> dict[str, Any]:
    """(fresh process) One timed run of ours, as the competitors are run: after an untimed
    warm-up run of :data:`WARM_TURNS` turns in another session of the same store (as DBOS's warm
    workflow and LangGraph's warm thread: first calls, lazy imports and the store's
    set-up stay out of the figure)."""
    import anyio

    warm = _open_session(backend, mode, Path(workdir))
    try:
        anyio.run(functools.partial(harness_run, warm, WARM_TURNS, instrument=False))
    finally:
        warm.close()
    session = _open_session(backend, mode, Path(workdir))
    try:
        res = anyio.run(functools.partial(harness_run, session, n, instrument=False))
    finally:
        session.close()
    return res


# -- competitors (each in a fresh subprocess) --------------------------------------------------
class GraphState(TypedDict):
    """LangGraph state: the conversation (appended to by each node) and the turn count."""

    messages: Annotated[list[dict[str, Any]], operator.add]
    turn: int


def child_langgraph(workdir: str, n: int) -> dict[str, Any]:
    """(fresh process) A model/tool graph looping ``n`` times, checkpointed to SQLite."""
    import sqlite3

    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:
        return {"skipped": f"import failed: {exc}"}
    import langgraph.version

    turns = script(n)

    def model(state: GraphState) -> dict[str, Any]:
        turn = state["turn"] + 1
        spec = turns[min(turn, len(turns)) - 1]
        content: list[dict[str, Any]] = [{"type": "text", "text": spec["text"]}]
        for i, call in enumerate(spec.get("tool_calls") or []):
            content.append(
                {
                    "type": "toolCall",
                    "id": f"call_{turn}_{i + 1}",
                    "name": call["name"],
                    "arguments": call["arguments"],
                }
            )
        msg = {
            "role": "assistant",
            "content": content,
            "provider": "scripted",
            "model": "scripted-1",
            "stopReason": "toolUse" if len(content) > 1 else "stop",
        }
        return {"messages": [msg], "turn": turn}

    def tool(state: GraphState) -> dict[str, Any]:
        last = state["messages"][-1]
        out = []
        for block in last["content"]:
            if block.get("type") == "toolCall":
                out.append(
                    {
                        "role": "toolResult",
                        "toolCallId": block["id"],
                        "toolName": "echo",
                        "content": [{"type": "text", "text": block["arguments"]["text"]}],
                        "isError": False,
                    }
                )
        return {"messages": out}

    def route(state: GraphState) -> str:
        last = state["messages"][-1]
        return "tool" if any(b.get("type") == "toolCall" for b in last["content"]) else END

    graph = StateGraph(GraphState)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tool", END])
    graph.add_edge("tool", "model")
    db = os.path.join(workdir, "langgraph.sqlite")
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    app = graph.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * n + 20}
    warm: Any = {"configurable": {"thread_id": "warm"}, "recursion_limit": 50}
    app.invoke({"messages": [], "turn": n - 2}, warm, durability="sync")  # setup, code paths
    t0 = time.perf_counter()
    final = app.invoke(
        {"messages": [{"role": "user", "content": "check every item"}], "turn": 0},
        config,
        durability="sync",
    )
    elapsed = time.perf_counter() - t0
    pragmas = {
        p: conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "synchronous")
    }
    checkpoints = conn.execute(
        "SELECT COUNT(*) FROM checkpoints WHERE thread_id='bench'"
    ).fetchone()[0]
    conn.close()
    return {
        "version": langgraph.version.__version__,
        "seconds": elapsed,
        "us_per_turn": elapsed / n * 1e6,
        "steps": 2 * n + 1,
        "us_per_step": elapsed / (2 * n + 1) * 1e6,
        "checkpoints": checkpoints,
        "messages": len(final["messages"]),
        "sqlite": pragmas,
        "db_bytes": os.path.getsize(db),
    }


def child_dbos(workdir: str, n: int, system_database_url: str | None = None) -> dict[str, Any]:
    """(fresh process) A DBOS workflow of ``n`` turns, two steps each, SQLite system DB (or
    the PostgreSQL one ``system_database_url`` names: ``bench/bench_postgres.py``)."""
    try:
        from dbos import DBOS, DBOSConfig
    except ImportError as exc:
        return {"skipped": f"import failed: {exc}"}
    import sqlite3
    from importlib.metadata import version

    turns = script(n)
    db = os.path.join(workdir, "dbos.sqlite")
    url = system_database_url or f"sqlite:///{db}"
    config: DBOSConfig = {"name": "dh-bench", "system_database_url": url}
    DBOS(config=config)

    @DBOS.step()
    def model_step(turn: int) -> dict[str, Any]:
        spec = turns[min(turn, len(turns)) - 1]
        content: list[dict[str, Any]] = [{"type": "text", "text": spec["text"]}]
        for i, call in enumerate(spec.get("tool_calls") or []):
            content.append(
                {
                    "type": "toolCall",
                    "id": f"call_{turn}_{i + 1}",
                    "name": call["name"],
                    "arguments": call["arguments"],
                }
            )
        return {
            "role": "assistant",
            "content": content,
            "provider": "scripted",
            "model": "scripted-1",
            "stopReason": "toolUse" if len(content) > 1 else "stop",
        }

    @DBOS.step()
    def tool_step(call: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": "toolResult",
            "toolCallId": call["id"],
            "toolName": "echo",
            "content": [{"type": "text", "text": call["arguments"]["text"]}],
            "isError": False,
        }

    @DBOS.workflow()
    def agent(limit: int) -> int:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "check every item"}]
        turn = 0
        while True:
            turn += 1
            msg = model_step(turn if turn <= limit else len(turns))
            messages.append(msg)
            calls = [b for b in msg["content"] if b.get("type") == "toolCall"]
            if not calls or turn > limit:
                break
            for call in calls:
                messages.append(tool_step(call))
        return len(messages)

    DBOS.launch()
    try:
        agent(WARM_TURNS)  # warm-up: tables, code paths
        t0 = time.perf_counter()
        count = agent(n)
        elapsed = time.perf_counter() - t0
    finally:
        DBOS.destroy()
    if system_database_url:
        return {
            "version": version("dbos"),
            "seconds": elapsed,
            "us_per_turn": elapsed / n * 1e6,
            "steps": 2 * n + 1,
            "us_per_step": elapsed / (2 * n + 1) * 1e6,
            "messages": count,
            "system_database": "postgresql",
        }
    conn = sqlite3.connect(db)
    pragmas = {
        p: conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "synchronous")
    }
    conn.close()
    return {
        "version": version("dbos"),
        "seconds": elapsed,
        "us_per_turn": elapsed / n * 1e6,
        "steps": 2 * n + 1,
        "us_per_step": elapsed / (2 * n + 1) * 1e6,
        "messages": count,
        "sqlite": pragmas,
        "db_bytes": os.path.getsize(db),
        "note": "journal_mode/synchronous read on a new connection after the run",
    }


VS = {
    "ours_jsonl_sync": ("child_ours", {"backend": "jsonl", "mode": "sync"}),
    "ours_sqlite_sync": ("child_ours", {"backend": "sqlite", "mode": "sync"}),
    "langgraph": ("child_langgraph", {}),
    "dbos": ("child_dbos", {}),
}


def fresh_child(
    name: str, work: Path, n: int, *, prefix: list[str] | None = None, tag: str = ""
) -> dict[str, Any]:
    """Run one of :data:`VS` in a fresh process with its own scratch directory."""
    func, extra = VS[name]
    sub = work / f"{name}{tag}"
    sub.mkdir()
    res = run_child(
        "bench.bench_harness",
        func,
        {"workdir": str(sub), "n": n, **extra},
        timeout=CHILD_TIMEOUT,
        prefix=prefix,
    )
    shutil.rmtree(sub, ignore_errors=True)
    if "error" in res:
        return {"skipped": f"failed: {res['error']}"[:600]}
    return res


def versus(work: Path, n: int) -> dict[str, Any]:
    """``VS_ROUNDS`` rounds, each running ours (JSONL and SQLite, sync), LangGraph and DBOS
    one after the other in fresh processes; ratios are taken within a round, then the median
    across rounds (the disk's fsync latency drifts between rounds)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VS}
    for r in range(VS_ROUNDS):
        for name in VS:
            if runs[name] and "skipped" in runs[name][-1]:
                continue
            res = fresh_child(name, work, n, tag=f"-r{r}")
            runs[name].append(res)
            log(
                f"  round {r + 1}: {name}: "
                + (res["skipped"] if "skipped" in res else f"{res['us_per_turn']:,.0f} us/turn")
            )
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        if any("skipped" in x for x in rs):
            out[name] = {"skipped": next(x["skipped"] for x in rs if "skipped" in x)}
            continue
        keep = {
            k: v
            for k, v in rs[-1].items()
            if k
            in (
                "version",
                "sqlite",
                "steps",
                "checkpoints",
                "messages",
                "outcome",
                "commits_per_turn",
                "first_turns_us",
                "last_turns_us",
            )
        }
        out[name] = _rounded(
            {
                "us_per_turn": median([x["us_per_turn"] for x in rs]),
                "rounds_us_per_turn": [x["us_per_turn"] for x in rs],
                **keep,
            }
        )
    ratios: dict[str, Any] = {}
    for mine in ("ours_jsonl_sync", "ours_sqlite_sync"):
        for comp in ("langgraph", "dbos"):
            if "skipped" in out[mine] or "skipped" in out[comp]:
                ratios[f"{mine}_vs_{comp}"] = None
                continue
            per = [
                a["us_per_turn"] / b["us_per_turn"]
                for a, b in zip(runs[mine], runs[comp], strict=False)
            ]
            ratios[f"{mine}_vs_{comp}"] = round(median(per), 3)
            ratios[f"{mine}_vs_{comp}_rounds"] = [round(x, 3) for x in per]
    out["ratios"] = ratios
    return out


def fsync_counts(work: Path) -> dict[str, Any]:
    """fsync-family system calls per turn of each contender, counted with ``strace -f -c``
    over two fresh runs of different lengths (setup costs cancel in the difference)."""
    strace = shutil.which("strace")
    if strace is None:
        return {"skipped": "strace not installed"}
    out: dict[str, Any] = {}
    lo, hi = STRACE_TURNS
    for name in VS:
        counts = []
        for n in (lo, hi):
            log_path = work / f"strace-{name}-{n}.txt"
            prefix = [
                strace,
                "-f",
                "-c",
                "-o",
                str(log_path),
                "-e",
                "trace=fsync,fdatasync,sync_file_range,msync",
            ]
            res = fresh_child(name, work, n, prefix=prefix, tag=f"-strace{n}")
            if "skipped" in res:
                counts = []
                out[name] = {"skipped": res["skipped"]}
                break
            counts.append(_strace_calls(log_path))
        if counts:
            per = {
                k: round((counts[1].get(k, 0) - counts[0].get(k, 0)) / (hi - lo), 2)
                for k in set(counts[0]) | set(counts[1])
            }
            out[name] = {"per_turn": per, "total_per_turn": round(sum(per.values()), 2)}
            log(f"  {name}: {out[name]['total_per_turn']} fsync-family calls per turn {per}")
    return out


def _strace_calls(path: Path) -> dict[str, int]:
    """Parse the ``calls`` column of an ``strace -c`` summary: ``{syscall: count}``."""
    calls: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return calls
    for line in text.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if m and m.group(2) != "total":
            calls[m.group(2)] = int(m.group(1))
    return calls


# -- entry point -------------------------------------------------------------------------------
def run() -> dict[str, Any]:
    """Run the harness benchmark; write ``bench/results/harness.json``; return the results."""
    import anyio

    n = N_TURNS
    with scratch_dir("harness") as work:
        results: dict[str, Any] = {
            "benchmark": "harness",
            "machine": machine_info(),
            "scratch_dir": str(work),
            "scratch_fs": fs_type(work),
            "turns": n,
            "tool_calls_per_turn": 1,
        }
        log(f"harness: {n} turns, one echo tool call each")
        base = anyio.run(plain_loop, n)
        results["baseline_plain_async"] = _rounded(base)
        log(f"  plain async loop: {base['us_per_turn']:,.1f} us/turn")
        results["side_by_side"] = plain_vs_memory(work, n)
        results["side_by_side_streamed"] = plain_vs_memory(work, STREAM_TURNS, STREAM_DELTAS)
        results["ours"] = ours(work, n)
        log("harness: ours vs LangGraph vs DBOS, fresh processes")
        results["versus"] = versus(work, n)
        log("harness: fsync-family system calls per turn (strace)")
        results["fsyncs_per_turn"] = fsync_counts(work)

    o, vs = results["ours"], results["versus"]
    vr = vs["ratios"]
    ratios: dict[str, Any] = {
        f"{name}_per_turn_vs_plain": ratio(o[name]["us_per_turn"], base["us_per_turn"])
        for name in o
    }
    for name in ("jsonl_sync", "jsonl_batch", "sqlite_sync", "sqlite_batch"):
        ratios[f"{name}_tool_call_vs_2_fsyncs"] = o[name]["paired"]["tool_call_vs_2_fsyncs"]
    ratios.update({k: v for k, v in vr.items() if not k.endswith("_rounds")})
    results["ratios"] = ratios
    results["skipped"] = [
        f"{k}: {vs[k]['skipped']}" for k in ("langgraph", "dbos") if "skipped" in vs[k]
    ]
    results["load_at_end"] = load_snapshot()
    side = results["side_by_side"]
    ratios["memory_vs_plain_cpu_side_by_side"] = side["cpu_memory_vs_plain"]
    ratios["memory_vs_plain_wall_side_by_side"] = side["wall_memory_vs_plain"]
    jsonl_fsyncs = results["fsyncs_per_turn"].get("ours_jsonl_sync", {}).get("total_per_turn")
    results["targets"] = [  # issue 22's goals ("The turn")
        target(
            side["cpu_memory_vs_plain"],
            "<=",
            4,
            "memory store per turn vs the plain async loop: CPU (process time), side by side",
        ),
        target(jsonl_fsyncs, "<=", 2, "JSONL sync: fsync-family calls per tool turn (strace)"),
        target(
            ratios["jsonl_sync_tool_call_vs_2_fsyncs"],
            "<=",
            1.5,
            "JSONL sync: one durable tool call (2 commits + tool) vs 2 raw fsyncs",
        ),
        target(
            vr.get("ours_jsonl_sync_vs_langgraph"),
            "<=",
            0.15,
            "JSONL sync per turn vs LangGraph (SqliteSaver, durability=sync)",
        ),
        target(
            vr.get("ours_jsonl_sync_vs_dbos"),
            "<=",
            0.08,
            "JSONL sync per turn vs DBOS (SQLite system database)",
        ),
        target(
            vr.get("ours_sqlite_sync_vs_langgraph"),
            "<=",
            0.4,
            "SQLite sync per turn vs LangGraph (SqliteSaver, durability=sync)",
        ),
    ]
    results["summary_rows"] = _rows(results, base)
    write_results("harness", results)
    return results


def _rows(results: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    o, vs, fs = results["ours"], results["versus"], results["fsyncs_per_turn"]
    ratios = results["ratios"]
    side = results["side_by_side"]
    rows: list[tuple[str, Any, str, str]] = [
        ("plain async loop (no storage)", base["us_per_turn"], "us/turn", "baseline (cold)"),
        (
            "side by side: memory vs plain, CPU",
            side["cpu_memory_vs_plain"],
            "x",
            f"warm, median of rounds {side['cpu_memory_vs_plain_rounds']}; memory "
            f"{side['cpu_memory_us_per_turn']:,.0f}, plain {side['cpu_plain_us_per_turn']} "
            f"us CPU/turn; wall {side['wall_memory_vs_plain']}x",
        ),
    ]
    streamed = results.get("side_by_side_streamed")
    if streamed:  # absent from results written before it existed
        rows.append(
            (
                f"  the same, answers of {STREAM_DELTAS:,} deltas",
                streamed["cpu_memory_vs_plain"],
                "x",
                f"rounds {streamed['cpu_memory_vs_plain_rounds']}; memory "
                f"{streamed['cpu_memory_us_per_turn']:,.0f}, plain "
                f"{streamed['cpu_plain_us_per_turn']:,.0f} us CPU/turn",
            )
        )
    for name, res in o.items():
        note = (
            f"{ratios[f'{name}_per_turn_vs_plain']}x plain; turns 1-20 "
            f"{res['first_turns_us']:,.0f} us, last 20 {res['last_turns_us']:,.0f} us; "
            f"context builds {res['context_share_of_turn']:.0%} of the time"
        )
        if res.get("wal_frames_per_turn") is not None:
            note += (
                f"; {res['wal_frames_per_turn']} WAL pages ({res['wal_bytes_per_turn'] / 1024:.1f}"
                " KiB) written per turn"
            )
        rows.append((f"ours {name}", res["us_per_turn"], "us/turn", note))
        if "paired" in res:
            p = res["paired"]
            rows.append(
                (
                    f"  tool call, {name}",
                    p["tool_call_us_median"],
                    "us",
                    f"{p['tool_call_vs_2_fsyncs']}x 2 fsyncs taken just before "
                    f"({p['two_fsyncs_us_median']:,.0f} us)",
                )
            )
    for name in VS:
        res = vs[name]
        if "skipped" in res:
            rows.append((name, None, "", res["skipped"][:120]))
            continue
        note = f"rounds {res['rounds_us_per_turn']}"
        if name in ("langgraph", "dbos"):
            note += (
                f"; ours jsonl sync = {vs['ratios'][f'ours_jsonl_sync_vs_{name}']}x, "
                f"sqlite sync = {vs['ratios'][f'ours_sqlite_sync_vs_{name}']}x"
            )
            note += f"; {res.get('version')}, sqlite {res.get('sqlite')}"
        if name in fs and "total_per_turn" in fs[name]:
            note += f"; {fs[name]['total_per_turn']} fsyncs/turn"
        rows.append((f"fresh process: {name}", res["us_per_turn"], "us/turn", note))
    return rows


CHILDREN = {
    "child_plain_vs_memory": child_plain_vs_memory,
    "child_ours": child_ours,
    "child_langgraph": child_langgraph,
    "child_dbos": child_dbos,
}

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(CHILDREN)
    else:
        run()
