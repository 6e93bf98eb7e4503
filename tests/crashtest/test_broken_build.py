"""The matrix catches a deliberately broken build: with the tool effect run before its intent is
written (``crash-test --broken-intent-order``), exactly the ``after_tool_effect`` cell fails,
on the ``effects`` invariant, naming the tag applied twice. One scenario on one backend, so it
stays small; the full matrix is in ``test_matrix.py``."""

from __future__ import annotations

import pytest

from durable_harness.crashtest.runner import run_matrix
from durable_harness.crashtest.scenario import load_all


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_broken_intent_order_is_caught() -> None:
    cells, summary = run_matrix(load_all(names=["single_tool"]), ["jsonl"], jobs=2, broken=True)
    assert summary["cells"] == len(cells) > 0
    assert summary["passed"] < summary["cells"]
    bad = [c for c in cells if c.status != "pass"]
    assert {c.label for c in bad} == {"after_tool_effect"}, [(c.label, c.failures) for c in bad]
    (cell,) = bad
    assert cell.status == "fail"
    assert any(f.startswith("effects:") for f in cell.failures), cell.failures
    assert any("t1" in f for f in cell.failures)
