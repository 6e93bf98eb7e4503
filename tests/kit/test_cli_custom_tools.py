"""``durable-harness crash-test --scenarios DIR`` on scenarios that name custom tools and a
custom provider by import path, importable from the folder the command runs in.

One run, three scenarios over one ``charge`` tool (jsonl, the three tool crash points only, to
keep it short): the
reconciling tool passes everywhere and is settled by ``reconcile`` after its effect; the
variant without ``reconcile`` needs a decision at the in-doubt points; a variant that falsely
declares ``replay: "safe"`` is re-run after its effect and its own ``count_effects`` check finds
the charge doubled, which fails that cell and the command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from durable_harness.crashtest import markdown
from durable_harness.crashtest.runner import Cell

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]

SHOP = """
import json
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.testing import Tool, ToolResult

TURNS = [
    {"text": "Charging.", "tool_calls": [
        {"name": "charge", "arguments": {"customer": "ada", "cents": 500}}]},
    {"text": "Done."},
]


def rows(cwd):
    path = Path(cwd) / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class ChargeArgs(BaseModel):
    customer: str
    cents: int


class UnsafeCharge(Tool):
    name = "charge"
    description = "Charge a customer."
    Args = ChargeArgs
    replay = "never"

    async def execute(self, args, ctx):
        with open(ctx.cwd / "ledger.jsonl", "a") as fh:
            fh.write(json.dumps({"key": ctx.idempotency_key, "cents": args.cents}) + "\\n")
        return ToolResult.text(f"charged {args.cents}")

    def count_effects(self, cwd):
        return Counter(r["key"] for r in rows(cwd))


class Charge(UnsafeCharge):
    async def reconcile(self, args, ctx):
        hit = [r for r in rows(ctx.cwd) if r["key"] == ctx.idempotency_key]
        return ToolResult.text(f"charged {hit[0]['cents']}") if hit else None


class LyingCharge(UnsafeCharge):
    replay = "safe"  # wrong: a second run charges again


def tools():
    return [Charge()]


def unsafe_tools():
    return [UnsafeCharge()]


def lying_tools():
    return [LyingCharge()]


def provider():
    return ScriptedProvider(TURNS)
"""


def _scenario(name: str, tools: str, **extra: object) -> str:
    return json.dumps(
        {
            "name": name,
            "tools": tools,
            "steps": [{"op": "prompt", "text": "charge ada"}, {"op": "wait"}],
            **extra,
        }
    )


def _run(folder: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS_CRASH")}
    env.pop("PYTHONPATH", None)
    env |= extra_env
    return subprocess.run(
        [*DH, "crash-test", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=590,
        check=False,
    )


@pytest.mark.crash
@pytest.mark.timeout(600)
def test_crash_test_runs_custom_tools_and_reports_decisions_and_doubles(tmp_path: Path) -> None:
    (tmp_path / "shop.py").write_text(textwrap.dedent(SHOP))
    scen = tmp_path / "scenarios"
    scen.mkdir()
    (scen / "charge.json").write_text(_scenario("charge", "shop:tools", provider="shop:provider"))
    inline = {  # the other two carry their script; "charge" gets it from its provider
        "turns": [
            {
                "text": "Charging.",
                "tool_calls": [{"name": "charge", "arguments": {"customer": "ada", "cents": 500}}],
            },
            {"text": "Done."},
        ]
    }
    (scen / "unsafe.json").write_text(_scenario("unsafe", "shop:unsafe_tools", **inline))
    (scen / "lying.json").write_text(_scenario("lying", "shop:lying_tools", **inline))
    report = tmp_path / "report.json"
    # the settled call: its settlement is written with the next provider request (merged
    # commits, design/crash-matrix.md), so that request's crash point is the settled cell
    points = ["after_tool_started", "after_tool_effect", "after_provider_request_started:2"]
    proc = _run(
        tmp_path,
        "--scenarios",
        "scenarios",
        "--backend",
        "jsonl",
        *(a for p in points for a in ("--point", p)),
        "--report",
        str(report),
    )
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())
    cells = {(c["scenario"], c["point"], c["hit"]): c for c in data["cells"]}
    assert {(s, p) for s, p, _h in cells} == {
        (s, p.partition(":")[0]) for s in ("charge", "unsafe", "lying") for p in points
    }
    failing = {(s, p) for (s, p, _h), c in cells.items() if c["status"] != "pass"}
    assert failing == {("lying", "after_tool_effect")}, proc.stdout[-4000:]
    # the reconciling tool: every cell passes, the effect cell settled by reconcile
    mine = {k[1:]: c for k, c in cells.items() if k[0] == "charge"}
    assert all(c["status"] == "pass" for c in mine.values())
    assert (
        mine[("after_tool_effect", 1)]["reconciled"]
        and not mine[("after_tool_effect", 1)]["decisions"]
    )
    assert not any(c["doubled"] for c in mine.values())
    # without reconcile: the in-doubt cells needed a decision (a custom tool's call is failed)
    unsafe = {k[1]: c for k, c in cells.items() if k[0] == "unsafe" and k[2] == 1}
    decided = {p for p, c in unsafe.items() if c["decisions"]}
    assert decided == {"after_tool_started", "after_tool_effect"}
    assert all(d.endswith("=fail") for d in unsafe["after_tool_effect"]["decisions"])
    assert all(c["status"] == "pass" and not c["doubled"] for c in unsafe.values())
    # the lying tool: re-run as "safe", its own check finds the charge doubled
    lying = cells[("lying", "after_tool_effect", 1)]
    assert [d.split(":")[0] for d in lying["doubled"]] == ["charge"]
    assert any(f.startswith("effects: applied twice: charge:") for f in lying["failures"])
    assert data["summary"]["doubled"] == 1
    assert data["summary"]["reconciled"] >= 1
    assert "doubled: charge:" in proc.stdout and "decision needed (fail)" in proc.stdout
    # the Markdown report lists the cells that needed a decision and the doubled effects
    text = markdown([Cell(**c) for c in data["cells"]], data["summary"])
    assert "## Cells that needed a decision" in text and "## Effects found doubled" in text
    assert "| after_tool_effect | pass (reconciled) | FAIL (doubled) | pass (decision) |" in text
    assert "| after_provider_request_started:2 | pass | pass | pass |" in text


@pytest.mark.slow
def test_a_bad_import_path_is_a_clear_error(tmp_path: Path) -> None:
    scen = tmp_path / "scenarios"
    scen.mkdir()
    (scen / "bad.json").write_text(_scenario("bad", "no_such_module:tools"))
    temp = tmp_path / "tmp"  # the child's temporary folders: none is left behind
    temp.mkdir()
    proc = _run(tmp_path, "--scenarios", "scenarios", "--backend", "jsonl", TMPDIR=str(temp))
    assert proc.returncode == 2
    assert "import_spec" in proc.stderr and "no_such_module" in proc.stderr, proc.stderr
    assert sorted(p.name for p in temp.iterdir()) == []
    (scen / "bad.json").write_text(_scenario("bad", "not a path"))
    proc = _run(tmp_path, "--scenarios", "scenarios", "--backend", "jsonl")
    assert proc.returncode == 2
    assert "module:function" in proc.stderr, proc.stderr
