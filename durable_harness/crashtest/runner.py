"""The crash matrix: every scenario x every crash point it reaches (x the n-th hit), on each
backend; what a cell does is ``design/crash-matrix.md`` "What a cell proves"."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio

from durable_harness import crash
from durable_harness.crashtest import forkserver, pgschemas, powercut
from durable_harness.crashtest.child import model_set, options
from durable_harness.crashtest.invariants import Baseline as Baseline
from durable_harness.crashtest.invariants import Cell as Cell
from durable_harness.crashtest.invariants import Evidence, check_all, conversation_of, effects_in
from durable_harness.crashtest.scenario import (
    Scenario,
    effect_tag,
    scenario_provider,
    scenario_tools,
)
from durable_harness.errors import FormatError
from durable_harness.harness.records import idempotency_key
from durable_harness.recovery.decide import Policy, RecoveryPlan, ToolCallPlan
from durable_harness.recovery.resume import plan_recovery, recover, resume_session
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.base import ToolContext
from durable_harness.tools.builtin import builtin_tools

CHILD_TIMEOUT = 60.0
MAX_HITS = 3

DEFAULT_JOBS = min(16, 4 * (os.cpu_count() or 1))
"""Cells run at once by default: four per CPU, at most 16. A cell waits more than it computes
(its child's fsyncs, the fork, the kill and the reaping, its folder made and removed), so on 2
cores the built-in matrix (JSONL and SQLite, the same ~40 CPU-s) took 47, 35, 32, 28 and 24 s
with 2, 3, 4, 6 and 8 jobs (``design/crash-matrix.md``, "Jobs")."""


PG_ENV = "DURABLE_HARNESS_CRASHTEST_PG"
"""The PostgreSQL URL the ``postgres`` backend's cells use (``crash-test`` sets it when unset)."""


def store_spec(backend: str, root: Path) -> str:
    """The store spec of a cell run in folder ``root`` on ``backend``."""
    if backend == "postgres":
        return _postgres_spec(root)
    return f"jsonl:{root / 'home'}" if backend == "jsonl" else f"sqlite:{root / 'store.db'}"


def _postgres_spec(root: Path) -> str:
    """The cell's store: a schema of the run's database (:mod:`.pgschemas`), named in the
    cell folder's ``.pg-schema`` (taken on first use), reached through ``search_path``."""
    base = os.environ.get(PG_ENV)
    if not base:
        raise FormatError(f"the postgres backend needs ${PG_ENV} (crash-test sets it)")
    marker = root / ".pg-schema"
    if marker.exists():
        schema = marker.read_text().strip()
    else:
        schema = pgschemas.take(base)
        marker.write_text(schema)
    return pgschemas.spec(base, schema)


def _drop_store(root: Path) -> None:
    """After a ``postgres`` cell in ``root``: give its schema back, emptied, for the next cell."""
    marker = root / ".pg-schema"
    base = os.environ.get(PG_ENV)
    if not base or not marker.exists():
        return
    pgschemas.give_back(base, marker.read_text().strip())
    marker.unlink()


def _prepare(sc: Scenario, root: Path) -> Path:
    work = root / "work"
    work.mkdir(parents=True)
    for rel, content in sc.files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(content)
    return work


def _child(
    sc: Scenario, root: Path, work: Path, backend: str, env: dict[str, str], *extra: str
) -> int:
    """Run the matrix child (:mod:`.child`) to its end or its SIGKILL; returns its exit code.
    Forked from the warm :mod:`.forkserver` unless ``DURABLE_HARNESS_CRASHTEST_FORK=0`` or the
    platform cannot fork (then a fresh interpreter); either way a real process.

    Raises:
        RuntimeError: the child failed (neither exit 0 nor SIGKILL), with the end of its stderr.
        subprocess.TimeoutExpired: it ran longer than :data:`CHILD_TIMEOUT` (it was killed).
    """
    args = [sc.path, store_spec(backend, root), str(work), str(root / "sid"), *extra]
    # the child imports custom tools from the runner's folder, then enters `work`
    if forkserver.enabled():
        done = forkserver.shared().run(args, env=env, cwd=os.getcwd(), timeout=CHILD_TIMEOUT)
        rc, err = done.returncode, done.output
    else:
        cmd = [sys.executable, "-m", "durable_harness.crashtest.child", *args]
        proc = subprocess.run(
            cmd,
            env=env,
            cwd=os.getcwd(),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            check=False,
        )
        rc, err = proc.returncode, proc.stderr
    if rc not in (0, -signal.SIGKILL):
        raise RuntimeError(f"child failed ({rc}): {err[-2000:]}")
    return rc


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (crash.ENV_VAR, crash.TRACE_VAR)}
    return env | extra


def baseline(
    sc: Scenario, backend: str, broken: bool = False, durability: str | None = None
) -> Baseline:
    """Run the scenario crash-free (in ``durability``), tracing every crash point it reaches."""
    tools = scenario_tools(sc)
    scenario_provider(sc)  # a bad import path fails here, by name, not in the child
    root = Path(tempfile.mkdtemp(prefix=f"dh-base-{sc.name}-"))  # a bad import leaves none
    try:
        work = _prepare(sc, root)
        trace = root / "trace"
        mode = {powercut.DURABILITY_ENV: durability} if durability else {}
        env = _env(DURABLE_HARNESS_CRASH_TRACE=str(trace), **mode)
        _child(sc, root, work, backend, env, *(["--broken-intent-order"] if broken else []))
        hits = Counter(trace.read_text().split()) if trace.exists() else Counter()
        store = open_store(store_spec(backend, root))
        with Session(store.open_session((root / "sid").read_text(), write=False)) as s:
            conv = conversation_of(s)
        return Baseline(conv, effects_in(work, tools, per_tool=True), hits)
    finally:
        _drop_store(root)
        shutil.rmtree(root, ignore_errors=True)


def cells_for(
    sc: Scenario, base: Baseline, backend: str, durability: str | None = None
) -> list[Cell]:
    """The cells of one scenario: each point it reaches, for hits 1..min(count, MAX_HITS)."""
    return [
        Cell(sc.name, backend, point, n, durability=durability)
        for point, count in sorted(base.hits.items())
        for n in range(1, min(count, MAX_HITS) + 1)
    ]


Decide = Callable[[ToolCallPlan, ToolContext], "dict[str, Any] | None"]
"""An operator callback: given a call awaiting a decision and its tool's context, return
``{"decision": "retry" | "fail" | "result", "result": text}`` or ``None`` (the default)."""


def default_decision(call: ToolCallPlan, ctx: ToolContext) -> dict[str, Any]:
    """The matrix operator's decision for an in-doubt call: its ``effects.log`` tag as the
    result, else a retry for a built-in call and a failure for a custom tool's
    (``design/testing-kit.md`` "Decisions")."""
    tag = effect_tag(call.tool_name, call.arguments or {})
    if tag is not None and effects_in(ctx.cwd).get(tag):
        return {"decision": "result", "result": f"already applied ({tag} is in effects.log)"}
    if call.tool_name in _BUILTIN_NAMES:
        return {"decision": "retry"}
    return {"decision": "fail", "result": "in doubt after a crash; not re-run"}


_BUILTIN_NAMES = frozenset(builtin_tools())


def run_cell(
    sc: Scenario,
    base: Baseline,
    cell: Cell,
    broken: bool = False,
    *,
    decide: Decide | None = None,
    policy: Policy = "ask",
    root: Path | None = None,
) -> Cell:
    """Run one cell: crash, recover, decide, resume, re-send, check.

    ``decide`` answers each call that awaits a decision (else :func:`default_decision`);
    ``policy`` is the resume policy. With ``root`` (an empty or missing folder) the cell runs
    there and is kept; otherwise a temporary folder is used and removed.
    """
    start = time.monotonic()
    keep = root is not None
    root = root or Path(tempfile.mkdtemp(prefix=f"dh-cell-{sc.name}-"))
    extra = ["--broken-intent-order"] if broken else []
    cut = powercut.PowerCut(cell.durability, root) if cell.durability else None
    try:
        work = _prepare(sc, root)
        env = _env(DURABLE_HARNESS_CRASH_AT=cell.point_hit, **(cut.crash_env() if cut else {}))
        rc = _child(sc, root, work, cell.backend, env, *extra)
        if rc != -signal.SIGKILL:
            cell.status, cell.failures = "error", [f"crash point not reached (exit {rc})"]
            return cell
        sid = (root / "sid").read_text().strip()
        if cut is not None:  # the power goes: the store keeps only what was durable
            cut.cut(cell.backend, sid)
            cell.lost = cut.lost
            cell.failures += cut.failures()
        store = open_store(store_spec(cell.backend, root))
        tools = scenario_tools(sc)
        with Session(store.open_session(sid)) as session:
            location = session.store.location
            plan = recover(session.store, tools, policy=policy, cwd=str(work))
            decisions = {}
            for lp in plan.lanes:
                purpose = "" if lp.purpose == "turn" else f" ({lp.purpose})"
                cell.plan.append(f"{lp.lane}:{lp.state}/{lp.next_action}{purpose}")
                cell.reconciled += [
                    c.tool_call_id for c in lp.tool_calls if c.action == "reconcile"
                ]
                # a policy is a standing decision: its outcome is a decision's outcome
                cell.decisions += [
                    f"{c.tool_call_id}=policy:fail" for c in lp.tool_calls if c.action == "fail"
                ]
                for c in lp.waiting():
                    ctx = ToolContext(
                        cwd=work,
                        run_id=lp.run_id or "",
                        tool_call_id=c.tool_call_id,
                        idempotency_key=idempotency_key(lp.run_id or "", c.call_key),
                    )
                    d = (decide and decide(c, ctx)) or default_decision(c, ctx)
                    decisions[c.call_key] = d
                    cell.decisions.append(f"{c.tool_call_id}={d['decision']}")
            before = session.store.last_seq()
            resumed, planned = anyio.run(_resume, session, tools, sc, decisions, str(work), policy)
            after = session.store.records(since_seq=before)
            accepted_before = _accepted_keys(session)
        env2 = _env(**(cut.continue_env() if cut else {}))
        rc2 = _child(sc, root, work, cell.backend, env2, "--continue", *extra)
        if rc2 != 0:
            cell.failures.append(f"continue: child exited {rc2}")
        with Session(store.open_session(sid, write=False)) as session:
            sent_after = _accepted_keys(session) - accepted_before
            unaccepted = bool(sent_after) or _lost_steps(sc, session) or bool(cell.lost)
            evidence = (session, work, location, unaccepted, tools, planned, after, resumed)
            cell.failures += check_all(Evidence(cell, base, *evidence))
    except Exception as exc:  # a broken cell is reported, not fatal to the matrix
        cell.status = "error"
        cell.failures.append(f"{type(exc).__name__}: {exc}"[:500])
    finally:
        if not keep:
            _drop_store(root)
            shutil.rmtree(root, ignore_errors=True)
        cell.seconds = time.monotonic() - start
    if cell.failures and cell.status == "pass":
        cell.status = "fail"
    return cell


def _accepted_keys(session: Session) -> set[str]:
    return {str(r["clientKey"]) for r in session.store.records() if r.get("clientKey")}


def _lost_steps(sc: Scenario, session: Session) -> bool:
    """True when a step could not be re-sent after the crash: a steer or follow-up whose run
    is over, or a step triggered by an event of the crashed run (abort, set_model)."""
    keys = _accepted_keys(session)
    for i, step in enumerate(sc.steps):
        if f"step-{i}" in keys:
            continue
        if (step["op"] in ("steer", "follow_up", "abort") or step.get("on")) and not (
            step["op"] == "set_model" and model_set(session, step)
        ):
            return True
    return False


async def _resume(
    session: Session,
    tools: Any,
    sc: Scenario,
    decisions: dict[str, dict[str, Any]],
    cwd: str,
    policy: Policy = "ask",
) -> tuple[dict[str, str], RecoveryPlan]:
    """Plan with the decisions, then resume by exactly that plan; returns outcomes and plan."""
    rec = await plan_recovery(session.store, tools, policy=policy, decisions=decisions, cwd=cwd)
    results = await resume_session(
        session,
        tools,
        provider=scenario_provider(sc),
        decisions=decisions,
        policy=policy,
        options=options(sc),
        recovery=rec,
    )
    return results, rec.plan


@contextlib.contextmanager
def _schemas_dropped(backends: list[str]) -> Iterator[None]:
    """The run's free PostgreSQL schemas (:mod:`.pgschemas`) dropped when it ends."""
    try:
        yield
    finally:
        if "postgres" in backends and os.environ.get(PG_ENV):
            pgschemas.drop_free(os.environ[PG_ENV])


def run_matrix(
    scenarios: list[Scenario],
    backends: list[str],
    *,
    jobs: int = DEFAULT_JOBS,
    broken: bool = False,
    progress: Callable[[Cell, int, int], None] | None = None,
    durabilities: list[str] | None = None,
    points: list[str] | None = None,
) -> tuple[list[Cell], dict[str, Any]]:
    """Run the whole matrix (only the cells whose point or ``point:n`` label is in ``points``,
    when given); returns the cells and summary figures (counts, wall seconds). With
    ``durabilities`` every cell is a power cut, once per mode (:mod:`.powercut`)."""
    start = time.monotonic()
    modes: list[str | None] = list(durabilities) if durabilities else [None]
    done: list[Cell] = []
    work: list[tuple[Scenario, Cell]] = []
    # the schemas dropped last, once the pool has waited for every cell
    with _schemas_dropped(backends), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # the baselines run `jobs` at once too (their children are as cheap as a cell's)
        bases = [
            (sc, backend, mode, pool.submit(baseline, sc, backend, broken, mode))
            for backend in backends
            for mode in modes
            for sc in scenarios
        ]
        futures = []
        for sc, backend, mode, base_fut in bases:
            base = base_fut.result()
            for c in cells_for(sc, base, backend, mode):
                if not points or c.point in points or c.label in points:
                    work.append((sc, c))
                    futures.append(pool.submit(run_cell, sc, base, c, broken))
        for fut in futures:
            cell = fut.result()
            done.append(cell)
            if progress:
                progress(cell, len(done), len(work))
    summary = {
        "cells": len(done),
        "passed": sum(c.status == "pass" for c in done),
        "failed": sum(c.status == "fail" for c in done),
        "errors": sum(c.status == "error" for c in done),
        "decisions": sum(bool(c.decisions) for c in done),
        "reconciled": sum(bool(c.reconciled) for c in done),
        "doubled": sum(bool(c.doubled) for c in done),
        "wall_seconds": round(time.monotonic() - start, 1),
        "jobs": jobs,
        "backends": backends,
        "scenarios": [s.name for s in scenarios],
    }
    if durabilities:
        summary["power_cut"] = powercut.summary_rows(done)
    return done, summary
