"""The crash matrix: scenarios x every crash point they reach, in real child processes.

(a) two scenarios pass at every point they reach; (b) a deliberately broken build (tool
effect before its intent) is caught, at the right cell, by the right invariant; (c, slow) the
full matrix on both backends through the console script; (d) the Markdown report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.crash import CRASH_POINTS
from durable_harness.crashtest.runner import Cell, run_matrix
from durable_harness.crashtest.scenario import load_all

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]

# every point a one-tool run passes through (each turn of single_tool is crash-tested)
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
REACHED = {"single_tool": RUN_POINTS, "steer": RUN_POINTS | {"after_queue_enqueued"}}
# points hit more than once (once per turn): their n-th hits are cells of their own
MULTI = {
    "single_tool": {"after_provider_request_started:2", "after_assistant_entry:2"},
    "steer": {"after_tool_started:2", "after_tool_effect:2", "after_assistant_entry:3"},
}


def _describe(cells: list[Cell]) -> str:
    return "\n".join(
        f"{c.backend} {c.scenario} {c.label}: {c.status} {c.failures}"
        for c in cells
        if c.status != "pass"
    )


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_matrix_single_tool_and_steer_pass() -> None:
    cells, summary = run_matrix(load_all(names=["single_tool", "steer"]), ["jsonl"], jobs=2)
    assert summary["cells"] == len(cells) > 0
    assert summary["passed"] == summary["cells"], _describe(cells)
    assert summary["failed"] == summary["errors"] == 0
    assert all(c.status == "pass" and not c.failures for c in cells), _describe(cells)
    for name, points in REACHED.items():
        mine = [c for c in cells if c.scenario == name]
        assert {c.point for c in mine} == points
        assert {c.point for c in mine} <= set(CRASH_POINTS)
        assert MULTI[name] <= {c.label for c in mine}
        assert len({c.label for c in mine}) == len(mine)  # no cell twice
        # the in-doubt cells needed the operator's decision, and got the right one
        by_label = {c.label: c for c in mine}
        assert [d.split("=")[1] for d in by_label["after_tool_started"].decisions] == ["retry"]
        assert [d.split("=")[1] for d in by_label["after_tool_effect"].decisions] == ["result"]
        assert not by_label["after_tool_finished"].decisions
    assert summary["decisions"] == sum(bool(c.decisions) for c in cells) >= 4


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_broken_intent_order_is_caught() -> None:
    cells, summary = run_matrix(load_all(names=["single_tool"]), ["jsonl"], jobs=2, broken=True)
    assert summary["passed"] < summary["cells"]
    bad = [c for c in cells if c.status != "pass"]
    assert {c.label for c in bad} == {"after_tool_effect"}, _describe(cells)
    (cell,) = bad
    assert cell.status == "fail"
    assert any(f.startswith("effects:") for f in cell.failures), cell.failures
    assert any("t1" in f for f in cell.failures)


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_full_matrix_both_backends(tmp_path: Path) -> None:
    report = tmp_path / "matrix.json"
    proc = subprocess.run(
        [*DH, "crash-test", "--jobs", "2", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=590,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())
    summary = data["summary"]
    assert summary["cells"] == len(data["cells"]) > 0
    assert summary["passed"] == summary["cells"]
    assert summary["failed"] == summary["errors"] == 0
    assert sorted(summary["backends"]) == ["jsonl", "sqlite"]
    assert {"cells", "passed", "failed", "errors", "decisions", "wall_seconds"} <= set(summary)
    every = {s.name for s in load_all()}
    assert set(summary["scenarios"]) == every
    for cell in data["cells"]:
        assert cell["status"] == "pass", cell
    for backend in ("jsonl", "sqlite"):
        assert {c["scenario"] for c in data["cells"] if c["backend"] == backend} == every
    # every crash point of the brief is exercised somewhere
    assert {c["point"] for c in data["cells"]} >= RUN_POINTS | {"after_abort_requested"}
    assert set(data["invariants"]) >= {"inputs", "effects", "damage", "results", "settled"}


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_crash_test_cli_markdown_report(tmp_path: Path) -> None:
    report = tmp_path / "x.md"
    args = ["--scenario", "single_tool", "--backend", "sqlite", "--report", str(report)]
    proc = subprocess.run(
        [*DH, "crash-test", *args],
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = report.read_text()
    assert md.startswith("# Crash matrix")
    assert "## sqlite" in md
    assert "## jsonl" not in md
    lines = md.splitlines()
    header = lines.index("| crash point | single_tool |")
    assert lines[header + 1] == "|---|---|"
    rows = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1]
    assert set(rows) >= RUN_POINTS
    assert rows["after_tool_effect"] == "pass (decision)"
    assert rows["after_run_started"] == "pass"
    assert set(rows.values()) <= {"pass", "pass (decision)"}
    assert "## Failures" not in md
    assert "sqlite" in proc.stdout
