"""The plan is the program: for generated crashes (a real child SIGKILLed at a generated crash
point of a generated scenario), generated damage to what it left on disk, a generated policy,
tool set and decisions, the records ``resume`` writes show exactly the actions the plan
computed just before it said (:func:`durable_harness.recovery.audit.plan_followed`).

Every cell of the crash matrix makes the same check (``plan`` invariant); this test adds the
damaged logs, the policies, the decisions and the tools missing today, on every backend
(PostgreSQL in the run's throw-away cluster, a schema per case).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_harness.crashtest import pgschemas, runner
from durable_harness.crashtest.child import options
from durable_harness.crashtest.scenario import Scenario, default_dir, load, scenario_provider
from durable_harness.errors import DurableHarnessError
from durable_harness.recovery.audit import plan_followed
from durable_harness.recovery.resume import plan_recovery, resume_session
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools

SCENARIOS = ("single_tool", "parallel_batch", "abort", "flaky_provider", "steer")
POINTS = (
    "after_run_started",
    "after_provider_request_started",
    "mid_provider_stream",
    "after_assistant_entry",
    "after_tool_started",
    "after_tool_effect",
    "after_tool_finished",
    "before_save_point",
    "after_abort_requested",
)
DAMAGE = ("none", "drop_record", "drop_last_commit")


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dh-plan-prog-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_env(pg_cluster: Any) -> Iterator[None]:
    """The ``postgres`` backend's cells use the run's cluster (``crash-test`` sets the same)."""
    before = os.environ.get(runner.PG_ENV)
    os.environ[runner.PG_ENV] = pg_cluster.spec
    yield
    pgschemas.drop_free(pg_cluster.spec)  # the cases' schemas, kept for reuse until now
    if before is None:
        os.environ.pop(runner.PG_ENV, None)
    else:
        os.environ[runner.PG_ENV] = before


def _crash(base: Path, sc: Scenario, backend: str, point: str) -> bool:
    """Run scenario ``sc`` in a child killed at the first hit of ``point``; False when the
    scenario never reaches the point."""
    work = runner._prepare(sc, base)
    env = runner._env(DURABLE_HARNESS_CRASH_AT=f"{point}:1")
    return runner._child(sc, base, work, backend, env) == -signal.SIGKILL


def _damage(root: Path, backend: str, sid: str, how: str, pick: int) -> None:
    """Lose one stored record: a whole commit line of a JSONL file, or a record row of SQLite
    or PostgreSQL (``drop_record`` picks one by ``pick``; ``drop_last_commit`` the last)."""
    if how == "none":
        return
    if backend == "jsonl":
        (path,) = list((root / "home").rglob(f"*{sid}*.jsonl"))
        lines = path.read_bytes().split(b"\n")
        body = [i for i, line in enumerate(lines) if i > 0 and line.strip()]
        if len(body) < 2:
            return
        victim = body[-1] if how == "drop_last_commit" else body[1 + pick % (len(body) - 1)]
        del lines[victim]
        path.write_bytes(b"\n".join(lines))
        return
    if backend == "postgres":
        import psycopg

        with psycopg.connect(runner.store_spec(backend, root), autocommit=True) as conn:
            seqs = [r[0] for r in conn.execute("SELECT seq FROM records ORDER BY seq")]
            if len(seqs) >= 2:
                victim = seqs[-1] if how == "drop_last_commit" else seqs[1 + pick % (len(seqs) - 1)]
                conn.execute("DELETE FROM records WHERE seq = %s", (victim,))
        return
    db = sqlite3.connect(root / "store.db")
    with db:
        seqs = [r[0] for r in db.execute("SELECT seq FROM records ORDER BY seq")]
        if len(seqs) < 2:
            return
        victim = seqs[-1] if how == "drop_last_commit" else seqs[1 + pick % (len(seqs) - 1)]
        db.execute("DELETE FROM records WHERE seq = ?", (victim,))
    db.close()


async def _resume_by_plan(
    spec: str, sid: str, sc: Scenario, policy: Any, drop: str | None, decide: list[str], cwd: str
) -> tuple[list[str], str]:
    tools = builtin_tools()
    if drop is not None:
        tools.pop(drop, None)
    with Session(open_store(spec).open_session(sid)) as session:
        first = await plan_recovery(session.store, tools, policy, None, cwd)
        waiting = [c for c in first.plan.open_calls() if c.action == "await_decision"]
        decisions = {
            c.call_key: {"decision": decide[i % len(decide)], "result": "done by hand"}
            for i, c in enumerate(waiting)
        }
        rec = await plan_recovery(session.store, tools, policy, decisions, cwd)
        before = session.store.last_seq()
        try:
            await resume_session(
                session,
                tools,
                provider=scenario_provider(sc),
                decisions=decisions,
                policy=policy,
                options=options(sc),
                recovery=rec,
            )
        except DurableHarnessError as exc:  # a typed refusal is allowed; then nothing ran
            after = session.store.records(since_seq=before)
            assert not [r for r in after if r["type"] == "tool_started"], exc
            return [], f"refused: {exc.code}"
        after = session.store.records(since_seq=before)
        return plan_followed(rec.plan, after), str([lp.next_action for lp in rec.plan.lanes])


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(SCENARIOS),
    backend=st.sampled_from(("jsonl", "sqlite", "postgres")),
    point=st.sampled_from(POINTS),
    damage=st.sampled_from(DAMAGE),
    pick=st.integers(0, 1000),
    policy=st.sampled_from(("ask", "retry-safe", "fail-in-doubt")),
    drop=st.sampled_from((None, "append_file", "bash")),
    decide=st.lists(st.sampled_from(("retry", "fail", "result")), min_size=1, max_size=3),
)
def test_resume_takes_exactly_the_planned_actions(
    workdir: Path,
    pg_env: None,
    name: str,
    backend: str,
    point: str,
    damage: str,
    pick: int,
    policy: Any,
    drop: str | None,
    decide: list[str],
) -> None:
    case = Path(tempfile.mkdtemp(prefix="case-", dir=workdir))
    try:
        sc = load(default_dir() / f"{name}.json")
        if not _crash(case, sc, backend, point):
            return  # the scenario never reaches this point: nothing to recover
        sid = (case / "sid").read_text().strip()
        _damage(case, backend, sid, damage, pick)
        spec = runner.store_spec(backend, case)
        problems, shown = anyio.run(
            _resume_by_plan, spec, sid, sc, policy, drop, decide, str(case / "work")
        )
        assert problems == [], (shown, problems)
    finally:
        if backend == "postgres":
            runner._drop_store(case)
        shutil.rmtree(case, ignore_errors=True)
