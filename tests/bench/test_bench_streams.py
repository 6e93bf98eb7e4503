"""Smoke test of ``python -m bench streams --quick``: a real server, the reader process's
256 streams open, and every figure written (no figure's value is judged here: speed targets
live in ``bench/``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .util import run_quick

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_streams_quick_writes_every_figure(tmp_path: Path) -> None:
    data = run_quick("streams", tmp_path, timeout=280)
    assert data["quick"] is True and data["turns_per_phase"] > 0
    for phase in ("none", "streams"):
        assert data["turns_per_s"][phase] > 0 and data["server_cpu_per_turn_ms"][phase] >= 0
    (readers,) = data["readers"]  # one repetition
    assert readers["opened"] == 256 and readers["reading"] == 64
    runs = data["runs_per_repetition"]
    assert data["turns_per_phase"] == runs * data["turns_per_run"]
    assert readers["min_run_ends"] == runs, readers  # every reading stream saw every run end
    assert readers["ended_by_server"] == 0
    (slowdown,) = data["targets"]
    assert slowdown["value"] is not None
    assert "load_at_start" in data["machine"] and "loadavg" in data["load_at_end"]
