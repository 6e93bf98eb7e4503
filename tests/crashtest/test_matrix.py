"""The crash matrix: scenarios x every crash point they reach, in real child processes.

The full matrix (every scenario, both backends, through the console script) runs once per
suite (``full_matrix`` in ``conftest.py``); the tests here read its report: (a) every cell
passes; (b) two scenarios reach every point a run passes through, each hit of a repeated point
is a cell of its own, and in-doubt cells got the right operator decision; (c) the Markdown
formatter, on a stored report and on the full one; (d) the plain progress lines of a run whose
stdout is a pipe. (The broken build the matrix must catch is in
``test_broken_build.py``, so that it runs on the other xdist worker.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crash import CRASH_POINTS
from durable_harness.crashtest import INVARIANTS, markdown
from durable_harness.crashtest.runner import Cell
from durable_harness.crashtest.scenario import load_all

from .conftest import MATRIX_TIMEOUT, MatrixRun

# A small report cut from real runs (see data/README.md).
STORED_REPORT = Path(__file__).parent / "data" / "small-report.json"

# every point a one-tool run passes through (each turn of single_tool is crash-tested)
RUN_POINTS = {
    "after_run_started",
    "after_provider_request_started",
    "mid_provider_stream",
    "after_assistant_entry",
    "after_tool_started",
    "after_tool_spawned",  # the scenarios' tool is bash
    "after_tool_effect",
    "before_run_finished",
    "after_run_finished",
}
# Points a one-tool turn no longer passes through: its settlement, its save point and the next
# provider request are one commit (design/crash-matrix.md, "Merged commits"). They remain where
# a settlement is written alone: a call of a parallel batch that is not the last to settle
# (parallel_batch), a save point delivering queued messages after a final answer (follow_up).
MERGED_POINTS = {"after_tool_finished", "before_save_point", "after_save_point"}
REACHED = {"single_tool": RUN_POINTS, "steer": RUN_POINTS | {"after_queue_enqueued"}}
# points hit more than once (once per turn): their n-th hits are cells of their own
MULTI = {
    "single_tool": {"after_provider_request_started:2", "after_assistant_entry:2"},
    "steer": {"after_tool_started:2", "after_tool_effect:2", "after_assistant_entry:3"},
}


def label(cell: dict[str, Any]) -> str:
    """A stored cell's label: ``point`` or ``point:n`` (as ``Cell.label``)."""
    return str(cell["point"]) if cell["hit"] == 1 else f"{cell['point']}:{cell['hit']}"


def cells_of(report: dict[str, Any]) -> list[Cell]:
    """The report's cells as the runner's ``Cell`` objects."""
    return [Cell(**c) for c in report["cells"]]


def _describe(cells: list[Cell]) -> str:
    return "\n".join(
        f"{c.backend} {c.scenario} {c.label}: {c.status} {c.failures}"
        for c in cells
        if c.status != "pass"
    )


def report_of(run: MatrixRun) -> dict[str, Any]:
    """The run's report; fails the test with the run's output when there is none."""
    assert run.report is not None, f"crash-test wrote no report (exit {run.returncode})\n" + (
        run.why()
    )
    return run.report


@pytest.mark.timeout(MATRIX_TIMEOUT)
@pytest.mark.crash
@pytest.mark.slow
def test_full_matrix_both_backends(full_matrix: MatrixRun) -> None:
    data = report_of(full_matrix)
    cells = cells_of(data)
    assert full_matrix.returncode == 0, _describe(cells) or full_matrix.why()
    summary = data["summary"]
    assert summary["cells"] == len(cells) > 0
    assert summary["passed"] == summary["cells"], _describe(cells)
    assert summary["failed"] == summary["errors"] == 0
    assert sorted(summary["backends"]) == ["jsonl", "sqlite"]
    assert {"cells", "passed", "failed", "errors", "decisions", "wall_seconds"} <= set(summary)
    assert summary["decisions"] == sum(bool(c.decisions) for c in cells)
    every = {s.name for s in load_all()}
    assert set(summary["scenarios"]) == every
    for backend in ("jsonl", "sqlite"):
        assert {c.scenario for c in cells if c.backend == backend} == every
    # no cell twice, and every crash point of the brief is exercised somewhere
    keys = [(c.backend, c.scenario, c.label) for c in cells]
    assert len(set(keys)) == len(keys)
    assert {c.point for c in cells} >= RUN_POINTS | MERGED_POINTS | {"after_abort_requested"}
    assert {c.point for c in cells} <= set(CRASH_POINTS)
    assert set(data["invariants"]) >= {"inputs", "effects", "damage", "results", "settled"}
    assert "report written to" in full_matrix.stdout


@pytest.mark.timeout(MATRIX_TIMEOUT)
@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_single_tool_and_steer_cells(full_matrix: MatrixRun, backend: str) -> None:
    cells = [c for c in cells_of(report_of(full_matrix)) if c.backend == backend]
    for name, points in REACHED.items():
        mine = [c for c in cells if c.scenario == name]
        assert all(c.status == "pass" and not c.failures for c in mine), _describe(mine)
        assert {c.point for c in mine} == points
        assert MULTI[name] <= {c.label for c in mine}
        # the in-doubt cells needed the operator's decision, and got the right one
        by_label = {c.label: c for c in mine}
        assert [d.split("=")[1] for d in by_label["after_tool_started"].decisions] == ["retry"]
        # spawned but held at its start gate: the effect never happened, so retry again
        assert [d.split("=")[1] for d in by_label["after_tool_spawned"].decisions] == ["retry"]
        assert [d.split("=")[1] for d in by_label["after_tool_effect"].decisions] == ["result"]
        # the settled call: since its settlement rides with the next provider request (the
        # merged commit), the crash after that request's intent is the cell where it is stored
        assert not by_label["after_provider_request_started:2"].decisions


# -- the Markdown report ----------------------------------------------------------------------


def tables(md: str) -> dict[str, dict[str, dict[str, str]]]:
    """Each backend's table of a Markdown report: ``{backend: {label: {scenario: verdict}}}``."""
    lines = md.splitlines()
    out: dict[str, dict[str, dict[str, str]]] = {}
    for i, line in enumerate(lines):
        if not line.startswith("## ") or not lines[i + 2].startswith("| crash point"):
            continue  # a section without a table (failures, decisions, doubled effects)
        backend = line[3:]
        assert lines[i + 1] == "", line
        header = [c.strip() for c in lines[i + 2].strip("|").split("|")]
        assert header[0] == "crash point", lines[i + 2]
        assert lines[i + 3] == "|---|" + "---|" * (len(header) - 1)
        rows: dict[str, dict[str, str]] = {}
        for row in lines[i + 4 :]:
            if not row.startswith("|"):
                break
            values = [c.strip() for c in row.strip("|").split("|")]
            assert len(values) == len(header), row
            assert values[0] not in rows, f"row {values[0]} twice"
            rows[values[0]] = dict(zip(header[1:], values[1:], strict=True))
        out[backend] = rows
    return out


def expected_tables(report: dict[str, Any]) -> dict[str, dict[str, dict[str, str]]]:
    """What each table must say, from the stored cells: a blank where a scenario does not reach
    a point, ``pass``, ``pass (decision)`` when an operator decision was needed (``reconciled``
    when a tool's reconcile settled a call), else the status in capitals."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for backend in report["summary"]["backends"]:
        mine = [c for c in report["cells"] if c["backend"] == backend]
        scenarios = sorted({c["scenario"] for c in mine})
        rows: dict[str, dict[str, str]] = {label(c): dict.fromkeys(scenarios, "") for c in mine}
        for c in mine:
            verdict = c["status"].upper() + (" (doubled)" if c.get("doubled") else "")
            if c["status"] == "pass":
                tags = [t for t, key in (("decision", "decisions"), ("reconciled", "reconciled"))
                        if c.get(key)]  # fmt: skip
                verdict = "pass" + (f" ({', '.join(tags)})" if tags else "")
            rows[label(c)][c["scenario"]] = verdict
        out[backend] = rows
    return out


def test_markdown_report_of_a_stored_report() -> None:
    report = json.loads(STORED_REPORT.read_text())
    summary = report["summary"]
    md = markdown(cells_of(report), summary)
    lines = md.splitlines()
    assert lines[0] == "# Crash matrix"
    assert lines[2] == (
        f"{summary['cells']} cells, {summary['passed']} passed, 1 failed, 0 errors; "
        f"{summary['decisions']} needed an operator decision, 0 were settled by a tool's "
        f"reconcile, 0 found an effect doubled; {summary['wall_seconds']} s with "
        f"{summary['jobs']} jobs."
    )
    for name, meaning in INVARIANTS.items():
        assert f"- **{name}**: {meaning}" in lines
    got = tables(md)
    assert got == expected_tables(report)
    # spot checks against the stored file, written out by hand
    assert list(got) == ["jsonl", "sqlite"]
    assert set(got["jsonl"]["after_tool_effect"].values()) == {"FAIL"}
    assert got["jsonl"]["after_tool_started"] == {"single_tool": "pass (decision)"}
    assert got["sqlite"]["after_tool_effect"] == {
        "single_tool": "pass (decision)",
        "steer": "pass (decision)",
    }
    assert got["sqlite"]["after_queue_enqueued"] == {"single_tool": "", "steer": "pass"}
    assert got["sqlite"]["after_tool_effect:2"] == {"single_tool": "", "steer": "pass (decision)"}
    # every failure in full, after the tables
    failures = lines[lines.index("## Failures") + 2 :]
    (bad,) = [c for c in report["cells"] if c["status"] != "pass"]
    assert failures == [
        f"- jsonl single_tool after_tool_effect: {'; '.join(bad['failures'])}",
    ]
    assert bad["failures"] and bad["failures"][0].startswith("effects:")


@pytest.mark.timeout(MATRIX_TIMEOUT)
@pytest.mark.crash
@pytest.mark.slow
def test_markdown_report_of_the_full_matrix(full_matrix: MatrixRun) -> None:
    report = report_of(full_matrix)
    md = markdown(cells_of(report), report["summary"])
    assert tables(md) == expected_tables(report)
    assert "## Failures" not in md


PROGRESS_LINE = re.compile(r"^crash-test: (\d+)/(\d+) cells, (\d+) failed, \d+ s$", re.M)
PROGRESS_START = "crash-test: running the crash-free baselines, "


@pytest.mark.timeout(MATRIX_TIMEOUT)
@pytest.mark.crash
@pytest.mark.slow
def test_plain_progress_lines_when_stdout_is_a_pipe(full_matrix: MatrixRun) -> None:
    """``crash-test`` writes a plain progress line when stdout is not a terminal (issue 22: at
    least every 10 s; the interval is an environment setting, 1 s for this run, so nothing
    here depends on time): read from the full matrix's own output, not from cells run again."""
    out = full_matrix.stdout
    cells = len(report_of(full_matrix)["cells"])
    lines = PROGRESS_LINE.findall(out)
    assert lines, out[-3000:]
    assert out.startswith(PROGRESS_START), out[:3000]  # before the total is known
    assert lines[-1] == (str(cells), str(cells), "0")  # at the end: every cell, none failed
    done = [int(d) for d, _, _ in lines]
    assert done == sorted(done)  # counts only go up
    assert {int(t) for _, t, _ in lines} == {cells}  # the total, once known, never changes
    assert "\x1b" not in out
