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


async def test_an_unknown_price_is_an_unknown_cost_never_zero(store: Store, workdir: Path) -> None:
    """Issue 20: a turn with no known price (no cost reported, no price given) settles with
    ``usage.cost`` null in the entry and the record; a run or session sum with such a turn
    is unknown, its known part kept apart; a price supplies the cost."""
    from durable_harness.harness.report import format_cost

    session = new_session(store, workdir)
    unpriced = ScriptedProvider([], by_prompt={"p": [{"text": "x", "usage": {"input": 1000}}]})
    priced = ScriptedProvider(
        [],
        by_prompt={"p": [{"text": "y", "usage": {"input": 1000, "output": 10}}]},
        pricing={"input": 3.0, "output": 15.0},
    )
    for provider in (priced, unpriced):
        async with Harness(session, provider, [], cwd=workdir) as h:
            assert await (await h.prompt("p")).wait() == "completed"
    finished = of_type(session.store.records("main"), "provider_request_finished")
    assert finished[0]["usage"]["cost"]["total"] == pytest.approx(0.00315)
    assert finished[1]["usage"]["cost"] is None
    answers = [
        e for e in session.store.iter_entries(("message",)) if e["message"]["role"] == "assistant"
    ]
    assert answers[1]["message"]["usage"]["cost"] is None

    report = cost_report(session.store)
    assert [t["cost"] for t in report["turns"]] == [pytest.approx(0.00315), None]
    priced_run, unpriced_run = report["runs"]
    assert priced_run["cost"] == pytest.approx(0.00315) and priced_run["unknown_cost_turns"] == 0
    assert unpriced_run["cost"] is None and unpriced_run["known_cost"] == 0
    assert report["total"]["cost"] is None
    assert report["total"]["known_cost"] == pytest.approx(0.00315)
    assert report["total"]["unknown_cost_turns"] == 1
    assert format_cost(report["total"]) == "≥ $0.003150 (1 unknown)"
    assert format_cost(unpriced_run) == "unknown"


def test_a_price_table_missing_a_token_kind_leaves_that_cost_unknown() -> None:
    from durable_harness.providers.base import empty_usage, priced

    usage = {**empty_usage(), "input": 10, "cacheRead": 5}
    assert priced(dict(usage), None)["cost"] is None
    assert priced(dict(usage), {"input": 1.0, "output": 2.0})["cost"] is None  # cacheRead unpriced
    full = priced(dict(usage), {"input": 1.0, "output": 2.0, "cacheRead": 0.5})["cost"]
    assert full["total"] == pytest.approx((10 * 1.0 + 5 * 0.5) / 1e6)
    assert priced({**empty_usage(), "input": 10}, {"input": 1.0})["cost"]["total"] == 1e-5


def test_price_flags_and_tables_parse_or_are_refused_by_name(tmp_path: Path) -> None:
    import json

    from durable_harness.errors import FormatError
    from durable_harness.providers import parse_price, pricing_for

    assert parse_price("3,15") == {"input": 3.0, "output": 15.0}
    assert parse_price("3,15,0.3,3.75")["cacheWrite"] == 3.75
    for bad in ("3", "3,x", "-1,2", "1,2,3,4,5"):
        with pytest.raises(FormatError, match="INPUT,OUTPUT"):
            parse_price(bad)
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"claude-x": {"input": 3, "output": 15}, "gpt-5.1": {"input": 1}}))
    prices = parse_price(str(table))
    assert pricing_for(prices, "anthropic:claude-x") == {"input": 3.0, "output": 15.0}
    assert pricing_for(prices, "openai:gpt-4o") is None  # not in the table: unknown
    assert pricing_for({"input": 2.0}, "openai:gpt-4o") == {"input": 2.0}
    table.write_text(json.dumps({"m": {"inputs": 3}}))
    with pytest.raises(FormatError, match="'inputs'"):
        parse_price(str(table))
    with pytest.raises(FormatError, match="cannot read"):
        parse_price(str(tmp_path / "missing.json"))
