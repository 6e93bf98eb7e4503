"""Harness benchmark: the per-turn cost of the durable run loop, and the same loop elsewhere.

The workload is one run of ``N_TURNS`` turns, each an assistant message (from the scripted
provider) with one call of a trivial ``echo`` tool, then a final answer. Measured in one run:

* **baseline**: the same loop as plain async function calls (provider stream, tool execute,
  messages kept in a list), no storage at all;
* **ours**: :class:`~durable_harness.harness.harness.Harness` on the memory backend (the loop's
  own logic, no I/O), then JSONL and SQLite in each durability mode (``sync``, ``batch``,
  ``none``); per turn, and the cost of one durable tool call (``tool_started`` intent, tool,
  result entry + ``tool_finished`` settlement: 2 commits) against 2 raw ``fdatasync`` calls
  measured right before and after that run;
* **LangGraph** (if ``langgraph`` and ``langgraph.checkpoint.sqlite`` import): a graph of the
  same shape (a ``model`` node, a ``tool`` node, looping ``N_TURNS`` times, messages in state)
  invoked with ``durability="sync"`` and a ``SqliteSaver`` checkpointer;
* **DBOS** (if ``dbos`` imports): a workflow with a SQLite system database, two steps per turn.

Competitors run in fresh subprocesses (their global state stays out of ours); a missing library
or a failure to start is recorded as ``skipped: <reason>``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    child_main,
    fs_type,
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
FLOOR_SAMPLES = 200  # raw fsyncs measured before and after each durable run
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


def script(n: int) -> list[dict[str, Any]]:
    """``n`` turns each calling ``echo`` once, then a final text answer."""
    turns: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: checking the next item.",
            "tool_calls": [{"name": "echo", "arguments": {"text": f"item {i}"}}],
            "usage": {"input": 100 + i, "output": 12},
        }
        for i in range(n)
    ]
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
async def plain_loop(n: int) -> dict[str, Any]:
    """The run loop without storage: stream each turn, run its tool calls, keep messages."""
    from durable_harness.providers.base import Done, ProviderRequest
    from durable_harness.providers.scripted import ScriptedProvider
    from durable_harness.tools.base import ToolContext

    provider = ScriptedProvider(script(n))
    tool = EchoTool()
    specs = [tool.spec()]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "check every item"}]}
    ]
    t0 = time.perf_counter()
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
    return {"turns": turn - 1, "seconds": elapsed, "us_per_turn": elapsed / n * 1e6}


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
    return Session(
        SqliteStore(work / "sqlite" / "h.db").create_session(str(work), durability=durability)
    )


async def harness_run(session: Any, n: int) -> dict[str, Any]:
    """One run of ``n`` tool turns through the Harness, instrumented from outside: each
    ``store.commit`` and each tool call (the harness's ``_run_tool``) is timed."""
    from durable_harness.harness.harness import Harness, HarnessOptions
    from durable_harness.providers.scripted import ScriptedProvider
    from durable_harness.storage.base import RecordOp

    store = session.store
    commit_times: dict[str, list[float]] = {}
    real_commit = store.commit

    def timed_commit(ops: list[Any], *args: Any, **kwargs: Any) -> int:
        kinds = [op.record["type"] for op in ops if isinstance(op, RecordOp)] or ["entry"]
        t0 = time.perf_counter()
        seq: int = real_commit(ops, *args, **kwargs)
        commit_times.setdefault("+".join(kinds), []).append(time.perf_counter() - t0)
        return seq

    store.commit = timed_commit
    harness = Harness(
        session, ScriptedProvider(script(n)), [EchoTool()], options=HarnessOptions(max_turns=n + 5)
    )
    tool_times: list[float] = []
    real_run_tool = harness._run_tool

    async def timed_run_tool(live: Any, call: Any) -> None:
        t0 = time.perf_counter()
        await real_run_tool(live, call)
        tool_times.append(time.perf_counter() - t0)

    harness._run_tool = timed_run_tool  # type: ignore[method-assign]
    turn_starts: list[float] = []
    harness.subscribe(
        lambda e: turn_starts.append(time.perf_counter()) if e["type"] == "turn_start" else None
    )
    async with harness:
        t0 = time.perf_counter()
        handle = await harness.prompt("check every item")
        outcome = await handle.wait()
        elapsed = time.perf_counter() - t0
    store.commit = real_commit
    gaps = [b - a for a, b in zip(turn_starts, turn_starts[1:], strict=False)]
    k = max(1, min(20, len(gaps) // 4))
    commits = sum(len(v) for v in commit_times.values())
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
    }


def ours(work: Path, n: int) -> dict[str, Any]:
    import anyio

    from bench.bench_storage import commit_line_size

    size = commit_line_size()
    out: dict[str, Any] = {}
    for backend, mode in OUR_CONFIGS:
        name = f"{backend}_{mode}" if backend != "memory" else "memory"
        sub = work / name
        sub.mkdir()
        before = fsync_latencies(sub, size, FLOOR_SAMPLES) if backend != "memory" else []
        session = _open_session(backend, mode, sub)
        try:
            res = anyio.run(harness_run, session, n)
        finally:
            session.close()
        after = fsync_latencies(sub, size, FLOOR_SAMPLES) if backend != "memory" else []
        if before:
            floor = median(before + after)
            res["fsync_floor_us"] = floor * 1e6
            res["fsync_floor_us_before_after"] = [median(before) * 1e6, median(after) * 1e6]
            res["tool_call_vs_2_fsyncs"] = ratio(res["tool_call_us_median"], 2 * floor * 1e6)
            commits2 = [
                v
                for k, v in res["commit_us_median"].items()
                if k in ("tool_started", "tool_finished")
            ]
            res["tool_commits_us"] = round(sum(commits2), 1)
            res["tool_commits_vs_2_fsyncs"] = ratio(sum(commits2), 2 * floor * 1e6)
        out[name] = {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}
        log(
            f"  ours {name}: {res['us_per_turn']:,.0f} us/turn, tool call "
            f"{res['tool_call_us_median']:,.0f} us (first turns {res['first_turns_us']:,.0f}, "
            f"last turns {res['last_turns_us']:,.0f} us/turn)"
        )
    return out


# -- competitors (each in a fresh subprocess) --------------------------------------------------
def child_langgraph(workdir: str, n: int) -> dict[str, Any]:
    """(fresh process) A model/tool graph looping ``n`` times, checkpointed to SQLite."""
    import operator
    import sqlite3
    from typing import Annotated, TypedDict

    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError as exc:
        return {"skipped": f"import failed: {exc}"}
    import langgraph.version

    turns = script(n)

    class State(TypedDict):
        messages: Annotated[list[dict[str, Any]], operator.add]
        turn: int

    def model(state: State) -> dict[str, Any]:
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

    def tool(state: State) -> dict[str, Any]:
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

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tool" if any(b.get("type") == "toolCall" for b in last["content"]) else END

    graph = StateGraph(State)
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


def child_dbos(workdir: str, n: int) -> dict[str, Any]:
    """(fresh process) A DBOS workflow of ``n`` turns, two steps each, SQLite system DB."""
    try:
        from dbos import DBOS, DBOSConfig
    except ImportError as exc:
        return {"skipped": f"import failed: {exc}"}
    import sqlite3
    from importlib.metadata import version

    turns = script(n)
    db = os.path.join(workdir, "dbos.sqlite")
    config: DBOSConfig = {"name": "dh-bench", "system_database_url": f"sqlite:///{db}"}
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
        agent(3)  # warm-up: tables, code paths
        t0 = time.perf_counter()
        count = agent(n)
        elapsed = time.perf_counter() - t0
    finally:
        DBOS.destroy()
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


def competitor(name: str, work: Path, n: int) -> dict[str, Any]:
    sub = work / name
    sub.mkdir()
    res = run_child(
        "bench.bench_harness", f"child_{name}", {"workdir": str(sub), "n": n}, timeout=CHILD_TIMEOUT
    )
    if "error" in res:
        return {"skipped": f"failed: {res['error']}"[:600]}
    if "skipped" not in res:
        log(f"  {name}: {res['us_per_turn']:,.0f} us/turn ({res['us_per_step']:,.0f} us/step)")
    else:
        log(f"  {name}: {res['skipped']}")
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}


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
        results["baseline_plain_async"] = {
            k: round(v, 2) if isinstance(v, float) else v for k, v in base.items()
        }
        log(f"  plain async loop: {base['us_per_turn']:,.1f} us/turn")
        results["ours"] = ours(work, n)
        results["langgraph"] = competitor("langgraph", work, n)
        results["dbos"] = competitor("dbos", work, n)

    o = results["ours"]
    lg, db = results["langgraph"], results["dbos"]
    js = o["jsonl_sync"]
    ratios: dict[str, Any] = {
        f"{name}_per_turn_vs_plain": ratio(o[name]["us_per_turn"], base["us_per_turn"])
        for name in o
    }
    ratios["jsonl_sync_tool_call_vs_2_fsyncs"] = js.get("tool_call_vs_2_fsyncs")
    ratios["jsonl_sync_tool_commits_vs_2_fsyncs"] = js.get("tool_commits_vs_2_fsyncs")
    ratios["sqlite_sync_tool_call_vs_2_fsyncs"] = o["sqlite_sync"].get("tool_call_vs_2_fsyncs")
    for comp_name, comp in (("langgraph", lg), ("dbos", db)):
        for mine in ("jsonl_sync", "sqlite_sync"):
            ratios[f"{mine}_vs_{comp_name}_per_turn"] = (
                None if "skipped" in comp else ratio(o[mine]["us_per_turn"], comp["us_per_turn"])
            )
    results["ratios"] = ratios
    results["skipped"] = [
        f"{k}: {v['skipped']}" for k, v in (("langgraph", lg), ("dbos", db)) if "skipped" in v
    ]
    results["targets"] = [
        target(
            js.get("tool_call_vs_2_fsyncs"),
            "<=",
            1.5,
            "JSONL sync: one durable tool call (2 commits + tool) vs 2 raw fsyncs",
        ),
        target(
            ratios["jsonl_sync_vs_langgraph_per_turn"],
            "<=",
            round(1 / 3, 4),
            "JSONL sync per turn vs LangGraph (SqliteSaver, durability=sync)",
        ),
        target(
            ratios["jsonl_sync_vs_dbos_per_turn"],
            "<=",
            0.2,
            "JSONL sync per turn vs DBOS (SQLite system database)",
        ),
    ]
    rows: list[tuple[str, Any, str, str]] = [
        ("plain async loop (no storage)", base["us_per_turn"], "us/turn", "baseline"),
    ]
    for name, res in o.items():
        note = (
            f"{ratios[f'{name}_per_turn_vs_plain']}x plain; {res['commits_per_turn']} commits/turn"
        )
        note += (
            f"; turns 1-20 {res['first_turns_us']:,.0f} us, last 20 {res['last_turns_us']:,.0f} us"
        )
        rows.append((f"ours {name}", res["us_per_turn"], "us/turn", note))
        if "tool_call_vs_2_fsyncs" in res:
            rows.append(
                (
                    f"  tool call, {name}",
                    res["tool_call_us_median"],
                    "us",
                    f"{res['tool_call_vs_2_fsyncs']}x 2 fsyncs (fsync "
                    f"{res['fsync_floor_us']:,.0f} us); its 2 commits "
                    f"{res['tool_commits_us']:,.0f} us = {res['tool_commits_vs_2_fsyncs']}x",
                )
            )
    for comp_name, comp in (("LangGraph", lg), ("DBOS", db)):
        key = comp_name.lower()
        if "skipped" in comp:
            rows.append((comp_name, None, "", comp["skipped"][:120]))
            continue
        rows.append(
            (
                f"{comp_name} {comp.get('version')}",
                comp["us_per_turn"],
                "us/turn",
                f"{comp['us_per_step']:,.0f} us/step; ours jsonl sync = "
                f"{ratios[f'jsonl_sync_vs_{key}_per_turn']}x, sqlite sync = "
                f"{ratios[f'sqlite_sync_vs_{key}_per_turn']}x; sqlite {comp.get('sqlite')}",
            )
        )
    results["summary_rows"] = rows
    write_results("harness", results)
    return results


CHILDREN = {"child_langgraph": child_langgraph, "child_dbos": child_dbos}

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(CHILDREN)
    else:
        run()
