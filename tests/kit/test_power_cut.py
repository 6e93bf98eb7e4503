"""The plugin's power-cut mode on a team's own tool: the README's ``charge`` example and its
power-cut test (``crash_matrix(..., power_cut=True)``) in a package outside the repository,
run by pytest in a subprocess over three crash points in each durability mode.

Checked from here, per cell (a conftest in the package writes each outcome down): every mode
ran every point and passed; ``sync`` lost no acknowledged input and charged once; ``none``
lost acknowledged inputs somewhere (so the cut is real: a SIGKILL never loses them); no cell
charged twice.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.testing import crash_matrix, run_crash, scenario

from .test_external_package import README, readme_files

POINTS = ("after_run_started", "after_tool_started", "after_tool_effect")

CONFTEST = """
import json
import os

import charge
import pytest


@pytest.fixture(autouse=True)
def _note_cell(request):
    yield
    out = request.node.funcargs.get("crash_cell")
    if out is not None:
        row = {
            "id": request.node.callspec.id,
            "mode": out.power_cut,
            "point": out.cell.label,
            "status": out.cell.status,
            "lost": out.lost,
            "charges": len(charge.ledger(out.work)),
        }
        with open(os.environ["CELLS_OUT"], "a") as fh:
            fh.write(json.dumps(row) + "\\n")
"""


def power_cut_example() -> str:
    """The README's power-cut test file."""
    (found,) = re.findall(
        r"<!-- kit-power-cut-example: test_power_cut.py -->\n```python\n(.*?)```",
        README.read_text(),
        re.S,
    )
    return str(found)


@pytest.mark.crash
@pytest.mark.timeout(600)
def test_a_power_cut_matrix_on_a_teams_own_tool(tmp_path: Path) -> None:
    pkg = tmp_path / "shop"
    pkg.mkdir()
    for name, text in readme_files().items():
        (pkg / name).write_text(text)
    (pkg / "test_power_cut.py").write_text(power_cut_example())
    (pkg / "conftest.py").write_text(CONFTEST)
    cells_out = tmp_path / "cells.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DURABLE_"))}
    env.pop("PYTHONPATH", None)
    env["CELLS_OUT"] = str(cells_out)
    proc = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_power_cut.py"),
            *("-k", " or ".join(POINTS)),
            f"--basetemp={tmp_path / 'bt'}",
        ],
        cwd=pkg,
        env=env,
        capture_output=True,
        text=True,
        timeout=590,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    cells = [json.loads(line) for line in cells_out.read_text().splitlines()]
    assert {(c["mode"], c["point"]) for c in cells} == {
        (m, p) for m in ("sync", "batch", "none") for p in POINTS
    }
    assert all(c["id"] == f"jsonl-{c['mode']}-{c['point']}" for c in cells)
    assert all(c["status"] == "pass" for c in cells), cells
    assert all(c["charges"] <= 1 for c in cells), cells  # never a second charge
    sync = [c for c in cells if c["mode"] == "sync"]
    assert all(c["charges"] == 1 and "inputs" not in c["lost"] for c in sync), sync
    # the cut is real: in none mode an acknowledged prompt was lost (a SIGKILL never loses it)
    assert any("inputs" in c["lost"] for c in cells if c["mode"] == "none"), cells


def test_power_cut_names_a_mode(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="power_cut: expected True, False or modes"):
        crash_matrix({"name": "x"}, power_cut=["fsync"])
    sc = scenario({"name": "x", "turns": [{"text": "hi"}], "steps": []}, tmp_path)
    with pytest.raises(ValueError, match="power_cut must be one of"):
        run_crash(sc, "after_run_started", power_cut="always")
