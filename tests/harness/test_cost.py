"""``cost_report``: per-turn and per-run totals from the settlements, and unknown cost for an
attempt that never settled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.harness.records import record
from durable_harness.harness.report import cost_report
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.storage import RecordOp, Store

from .util import EchoTool, new_session, of_type

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def usage(inp: int, out: int, cost_in: float, cost_out: float) -> dict[str, Any]:
    return {"input": inp, "output": out, "cost": {"input": cost_in, "output": cost_out}}


RUN_A = [
    {
        "text": "a1",
        "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}],
        "usage": usage(100, 20, 0.001, 0.002),
        "fail_attempts": 1,  # a failed attempt settles: its cost is known (nothing billed)
    },
    {"text": "a2", "usage": usage(150, 30, 0.0015, 0.003)},
]
RUN_B = [{"text": "b1", "usage": usage(400, 50, 0.004, 0.005)}]


async def two_runs(store: Store, workdir: Path) -> tuple[Any, list[str]]:
    session = new_session(store, workdir)
    provider = ScriptedProvider([], by_prompt={"run a": RUN_A, "run b": RUN_B})
    opts = HarnessOptions(retry_initial=0.01, retry_max=0.02)
    run_ids = []
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=opts) as h:
        for prompt in ("run a", "run b"):
            handle = await h.prompt(prompt)
            assert await handle.wait() == "completed"
            run_ids.append(handle.run_id)
    return session, run_ids


async def test_cost_per_turn_and_per_run(store: Store, workdir: Path) -> None:
    session, (run_a, run_b) = await two_runs(store, workdir)
    report = cost_report(session.store)

    turns = [(t["run_id"], t["turn"], t["tokens"], t["cost"]) for t in report["turns"]]
    assert [t[:3] for t in turns] == [(run_a, 1, 120), (run_a, 2, 180), (run_b, 1, 450)]
    assert [t[3] for t in turns] == pytest.approx([0.003, 0.0045, 0.009])
    assert all(t["purpose"] == "turn" for t in report["turns"])

    runs = {r["run_id"]: r for r in report["runs"]}
    assert set(runs) == {run_a, run_b}
    assert runs[run_a]["turns"] == 2 and runs[run_a]["tokens"] == 300
    assert runs[run_a]["cost"] == pytest.approx(0.0075)
    assert runs[run_b]["turns"] == 1 and runs[run_b]["tokens"] == 450
    assert runs[run_b]["cost"] == pytest.approx(0.009)
    assert report["total"]["tokens"] == 750
    assert report["total"]["cost"] == pytest.approx(0.0165)
    assert report["unknown_cost_attempts"] == 0

    # The report agrees with the usage stored on the assistant entries.
    entries = [
        e for e in session.store.iter_entries(("message",)) if e["message"]["role"] == "assistant"
    ]
    assert sum(e["message"]["usage"]["cost"]["total"] for e in entries) == pytest.approx(0.0165)
    assert len(of_type(session.store.records(), "provider_request_failed")) == 1


async def test_an_attempt_without_settlement_is_unknown_cost(store: Store, workdir: Path) -> None:
    session, (_run_a, _) = await two_runs(store, workdir)
    known = cost_report(session.store)
    # An attempt whose process died mid-request: intent without settlement.
    session.store.commit(
        [
            RecordOp(
                record(
                    "provider_request_started",
                    "main",
                    "lost-run",
                    turn=1,
                    attempt=1,
                    responseEntryId="never-written",
                    provider="scripted",
                    model="scripted-1",
                )
            )
        ]
    )
    report = cost_report(session.store)
    assert report["unknown_cost_attempts"] == 1
    # Unknown is not zero: the known totals are unchanged, the lost attempt adds no turn.
    assert report["total"] == known["total"]
    assert report["turns"] == known["turns"]

    # A second lost attempt of another turn counts too; settling one removes it.
    session.store.commit(
        [RecordOp(record("provider_request_started", "main", "lost-run", turn=2, attempt=1))]
    )
    assert cost_report(session.store)["unknown_cost_attempts"] == 2
    session.store.commit(
        [
            RecordOp(
                record(
                    "provider_request_failed",
                    "main",
                    "lost-run",
                    turn=2,
                    attempt=1,
                    error="boom",
                    retryable=True,
                )
            )
        ]
    )
    assert cost_report(session.store)["unknown_cost_attempts"] == 1


async def test_report_survives_reopen(store: Store, workdir: Path) -> None:
    session, _ = await two_runs(store, workdir)
    before = cost_report(session.store)
    sid = session.id
    session.close()
    reader = store.open_session(sid, write=False)
    try:
        assert cost_report(reader) == before
    finally:
        reader.close()
