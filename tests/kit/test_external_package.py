"""The kit from outside: a small package in a temporary folder (not the repository) defines a
``charge`` tool over a ledger file and crash-tests it with only the pytest plugin (loaded by
its ``pytest11`` entry point) and the public API; pytest runs it in a subprocess.

Checked from here: every crash point a one-tool run passes was a test of its own and passed
(each one asserting the ledger holds the charge once and every invariant held), and the
variant without ``reconcile`` was caught awaiting a decision where the reconciling tool was
not, and its doubled charge (after an explicit retry) was found by the tool's own check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from durable_harness.crash import CRASH_POINTS

# every point a run with one tool call passes through
RUN_POINTS = {
    "after_run_started",
    "after_provider_request_started",
    "mid_provider_stream",
    "after_assistant_entry",
    "after_tool_started",
    "after_tool_effect",
    "after_tool_finished",
    "before_save_point",
    "after_save_point",
    "before_run_finished",
    "after_run_finished",
}

LEDGER = '''
"""A toy payment ledger: one JSON line per charge, keyed by the call's idempotency key."""
import json
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from durable_harness.testing import Tool, ToolContext, ToolResult


def rows(cwd):
    path = Path(cwd) / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def find(cwd, key):
    return next((r for r in rows(cwd) if r["key"] == key), None)


class ChargeArgs(BaseModel):
    customer: str
    cents: int


class UnsafeCharge(Tool):
    """Appends a charge; no way to tell after a crash whether it did."""

    name = "charge"
    description = "Charge a customer."
    Args = ChargeArgs
    replay = "never"

    async def execute(self, args, ctx):
        with open(ctx.cwd / "ledger.jsonl", "a") as fh:
            fh.write(json.dumps({"key": ctx.idempotency_key, "customer": args.customer,
                                 "cents": args.cents}) + "\\n")
        return ToolResult.text(f"charged {args.customer} {args.cents} cents")

    def count_effects(self, cwd):
        return Counter(r["key"] for r in rows(cwd))


class Charge(UnsafeCharge):
    """The same, plus reconcile: the ledger row with this call's key says it happened."""

    async def reconcile(self, args, ctx):
        row = find(ctx.cwd, ctx.idempotency_key)
        return None if row is None else ToolResult.text(
            f"charged {row['customer']} {row['cents']} cents")


def tools():
    return [Charge()]


def unsafe_tools():
    return [UnsafeCharge()]
'''

TEST_CHARGE = """
import ledger
from durable_harness.testing import crash_matrix

SCENARIO = {
    "name": "charge",
    "tools": "ledger:tools",
    "turns": [
        {"text": "Charging.", "tool_calls": [
            {"name": "charge", "arguments": {"customer": "ada", "cents": 500}}]},
        {"text": "Done."},
    ],
    "steps": [{"op": "prompt", "text": "charge ada 5 dollars"}, {"op": "wait"}],
}


def retry_if_not_in_ledger(call, ctx):
    return None if ledger.find(ctx.cwd, ctx.idempotency_key) else {"decision": "retry"}


@crash_matrix(SCENARIO, decide=retry_if_not_in_ledger)
def test_charge(crash_cell):
    crash_cell.assert_invariants()
    assert [r["customer"] for r in ledger.rows(crash_cell.work)] == ["ada"]
    assert not crash_cell.doubled
    if crash_cell.cell.point == "after_tool_effect":
        assert crash_cell.reconciled and not crash_cell.awaiting_decision


UNSAFE = {**SCENARIO, "name": "unsafe_charge", "tools": "ledger:unsafe_tools"}


def test_unsafe_charge_awaits_a_decision(crash_run):
    out = crash_run(UNSAFE, "after_tool_effect")
    out.assert_invariants()
    assert out.awaiting_decision and not out.reconciled
    assert len(ledger.rows(out.work)) == 1  # the default decision never re-runs it


def test_unsafe_charge_retried_is_doubled(crash_run):
    out = crash_run(UNSAFE, "after_tool_effect", decide=lambda call, ctx: {"decision": "retry"})
    assert len(ledger.rows(out.work)) == 2
    assert [d.split(":", 1)[0] for d in out.doubled] == ["charge"]
"""


@pytest.mark.crash
@pytest.mark.timeout(600)
def test_a_package_outside_the_repo_crash_tests_its_own_tool(tmp_path: Path) -> None:
    pkg = tmp_path / "shop"
    pkg.mkdir()
    (pkg / "ledger.py").write_text(textwrap.dedent(LEDGER))
    (pkg / "test_charge.py").write_text(textwrap.dedent(TEST_CHARGE))
    report = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DURABLE_"))}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=pkg,
        env=env,
        capture_output=True,
        text=True,
        timeout=590,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    cases = {
        c.get("name", ""): [child.tag for child in c]
        for c in ET.parse(report).getroot().iter("testcase")
    }
    assert all(tags == [] for tags in cases.values()), cases  # no failure, error or skip
    labels = {
        name[len("test_charge[jsonl-") : -1]
        for name in cases
        if name.startswith("test_charge[jsonl-")
    }
    # every crash point a one-tool run reaches was a test, and the n-th hits too
    assert {label.partition(":")[0] for label in labels} == RUN_POINTS <= set(CRASH_POINTS)
    assert "after_provider_request_started:2" in labels
    assert {"test_unsafe_charge_awaits_a_decision", "test_unsafe_charge_retried_is_doubled"} <= set(
        cases
    )
