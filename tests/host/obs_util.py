"""Drive real harness runs for the observability tests: a JSONL store under ``tmp_path``, the
scripted provider, the builtin tools (real files, a real ``bash``), and any number of event
observers taking ``(session_id, event)`` (``HostMetrics.observe``, ``HostTracer.observe``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from prometheus_client.parser import text_string_to_metric_families

from durable_harness.crashtest import forkserver
from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.recovery.resume import plan_recovery, resume_lane
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools

Observer = Callable[[str, dict[str, Any]], None]

OK_PROMPT = "read the notes"
FAIL_PROMPT = "read the missing file"

#: Run 1 (completes): turn 1 reads a file and runs ``bash`` (two calls, in parallel), turn 2
#: answers. Run 2 (fails): turn 1 reads a missing file (an error result), turn 2's every
#: attempt fails (retryable 503) until the attempt cap (2) fails the run.
BY_PROMPT: dict[str, list[dict[str, Any]]] = {
    OK_PROMPT: [
        {
            "text": "Reading the notes.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "notes.txt"}},
                {"name": "bash", "arguments": {"command": "echo ran"}},
            ],
            "usage": {"input": 100, "output": 10, "cacheRead": 40},
        },
        {"text": "The notes say hello.", "usage": {"input": 130, "output": 6}},
    ],
    FAIL_PROMPT: [
        {
            "text": "Reading it.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "missing.txt"}}],
            "usage": {"input": 50, "output": 7},
        },
        {"text": "never said", "fail_attempts": 9},
    ],
}

#: What the scripted answers above report (the tests' expected token totals).
TOKENS = {"input": 100 + 130 + 50, "output": 10 + 6 + 7, "cache_read": 40}


@dataclass
class Runs:
    """What :func:`two_runs` did: the session id, its JSONL file, each run's id and outcome."""

    session_id: str
    path: Path
    run_ids: list[str]
    outcomes: list[str]


def commit_lines(path: Path) -> int:
    """Commit lines in a JSONL session file (one per commit; the header and padding excluded)."""
    return sum(1 for line in path.read_bytes().splitlines() if line.startswith(b'{"gen"'))


def two_runs(
    tmp_path: Path, observers: list[Observer], *, before: Callable[[], None] = lambda: None
) -> Runs:
    """Create a session on a JSONL store (``batch`` durability) and run :data:`FAIL_PROMPT`
    after :data:`OK_PROMPT` to their ends with every observer subscribed. ``before`` runs once
    the session exists, before the first run (to start counting)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "notes.txt").write_text("hello\n")
    store = open_store(f"jsonl:{tmp_path / 'home'}")
    session = Session(store.create_session(str(work), durability="batch"))
    sid = session.id
    provider = ScriptedProvider([], by_prompt=BY_PROMPT)
    options = HarnessOptions(attempt_cap=2, retry_initial=0.001, retry_max=0.002)
    run_ids: list[str] = []
    outcomes: list[str] = []

    async def main() -> None:
        async with Harness(session, provider, builtin_tools(), cwd=work, options=options) as h:
            for observe in observers:
                h.subscribe(lambda e, observe=observe: observe(sid, e))
            for prompt in (OK_PROMPT, FAIL_PROMPT):
                handle = await h.prompt(prompt)
                run_ids.append(handle.run_id)
                with anyio.fail_after(30):
                    outcomes.append(await handle.wait())

    before()
    anyio.run(main)
    path = Path(session.store.location)
    session.close()
    return Runs(sid, path, run_ids, outcomes)


# -- an in-doubt call, left by a real SIGKILL ------------------------------------------------


def crashed_in_doubt(tmp_path: Path) -> tuple[str, str, Path]:
    """Run ``durable-harness run`` in a child (forked from the warm fork server,
    ``forkserver.run_cli``) that SIGKILLs itself right after its ``bash`` call's intent is
    durable (``after_tool_started``): the call is in doubt (``replay: never``). Returns
    ``(store spec, session id, working directory)``."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    script = tmp_path / "script.json"
    turns = [
        {
            "text": "Running it.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "echo ran >> effects.log"}}],
        },
        {"text": "Finished."},
    ]
    script.write_text(json.dumps({"turns": turns}))
    spec = f"jsonl:{tmp_path / 'home'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS_CRASH")}
    env["DURABLE_HARNESS_CRASH_AT"] = "after_tool_started"
    argv = ["run", "do it", "--provider", f"scripted:{script}", "--store", spec]
    proc = forkserver.run_cli([*argv, "--cwd", str(work)], env=env, cwd=os.getcwd(), timeout=60)
    assert proc.returncode < 0, f"the child did not crash: {proc.returncode} {proc.stderr}"
    sid = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("session "))
    return spec, sid, work


def resume_with(
    spec: str,
    sid: str,
    work: Path,
    observers: list[Observer],
    decisions: dict[str, dict[str, Any]] | None = None,
) -> tuple[str, list[str]]:
    """Resume the session's ``main`` lane in this process with every observer subscribed
    (policy ``ask``: an in-doubt call without a decision suspends the run); returns the run's
    ``(outcome, awaiting)``."""
    provider = ScriptedProvider([{"text": "(stored)"}, {"text": "Finished."}])

    async def main() -> tuple[str, list[str]]:
        with Session(open_store(spec).open_session(sid)) as s:
            tools = builtin_tools()
            recovery = await plan_recovery(s.store, tools, "ask", decisions, str(work))
            async with Harness(s, provider, tools, cwd=work) as h:
                for observe in observers:
                    h.subscribe(lambda e, observe=observe: observe(sid, e))
                handle = await resume_lane(h, recovery)
                assert handle is not None
                with anyio.fail_after(30):
                    return await handle.wait(), handle.awaiting

    return anyio.run(main)


# -- reading an exposition ------------------------------------------------------------------


def samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``{(sample name, labels): value}`` of a Prometheus text exposition."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(
    got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """One sample's value (0 when the series does not exist)."""
    return got.get((name, frozenset(labels.items())), 0.0)
