"""The kit's pytest-free core on the SQLite backend, and the plugin's usage errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.testing import crash_points, run_crash, scenario

from .test_external_package import readme_files

SCENARIO = {
    "name": "charge_sqlite",
    "tools": "charge:tools",
    "turns": [
        {
            "text": "Charging.",
            "tool_calls": [{"name": "charge", "arguments": {"customer": "ada", "cents": 500}}],
        },
        {"text": "Done."},
    ],
    "steps": [{"op": "prompt", "text": "charge ada"}, {"op": "wait"}],
}


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The README's ``charge`` module in the current folder."""
    folder = tmp_path / "shop"
    folder.mkdir()
    (folder / "charge.py").write_text(readme_files()["charge.py"])
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    sys.modules.pop("charge", None)


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_run_crash_on_sqlite_reconciles_the_charge(shop: Path, tmp_path: Path) -> None:
    sc = scenario(SCENARIO, tmp_path / "sc")
    assert ("after_tool_effect", 1) in crash_points(sc, "sqlite")
    out = run_crash(sc, "after_tool_effect", backend="sqlite", root=tmp_path / "cell")
    out.assert_invariants()
    assert out.reconciled and not out.awaiting_decision and not out.doubled
    assert out.store_spec.startswith("sqlite:") and out.work == tmp_path / "cell" / "work"
    assert len((out.work / "ledger.jsonl").read_text().splitlines()) == 1
    with out.open_session() as session:
        outcomes = [r.get("outcome") for r in session.store.records(types=("tool_finished",))]
    assert outcomes == ["reconciled"]
    with pytest.raises(ValueError, match="backend must be one of"):
        run_crash(sc, "after_tool_effect", backend="postgres")


@pytest.mark.slow
def test_crash_cell_without_the_decorator_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("def test_x(crash_cell):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "needs @crash_matrix(scenario)" in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_a_policy_decides_instead_of_the_callback(shop: Path, tmp_path: Path) -> None:
    """``fail-in-doubt``: the in-doubt charge (no reconcile) is failed by the policy, so nothing
    waits for a decision and the callback is never asked."""
    (shop / "unsafe.py").write_text(
        "import charge\nfrom durable_harness.testing import Tool\n\n\n"
        "class Unsafe(charge.Charge):\n    reconcile = Tool.reconcile\n\n\n"
        "def tools():\n    return [Unsafe()]\n"
    )
    sc = scenario({**SCENARIO, "name": "unsafe_sqlite", "tools": "unsafe:tools"}, tmp_path / "s")
    asked: list[str] = []
    out = run_crash(
        sc,
        "after_tool_effect",
        root=tmp_path / "cell",
        policy="fail-in-doubt",
        decide=lambda call, ctx: asked.append(call.tool_call_id),  # type: ignore[func-returns-value]
    )
    out.assert_invariants()
    assert asked == [] and not out.awaiting_decision and not out.reconciled
    assert [d.split("=")[1] for d in out.cell.decisions] == ["policy:fail"]
    assert len((out.work / "ledger.jsonl").read_text().splitlines()) == 1
    with out.open_session() as session:
        outcomes = [r.get("outcome") for r in session.store.records(types=("tool_finished",))]
    assert outcomes == ["failed_by_policy"]
