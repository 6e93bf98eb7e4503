"""Smoke test of ``python -m bench host --quick``: it runs end to end (its host process is
SIGKILLed in flight, a fresh one reconciles) and writes every figure the issue asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from .util import run_quick

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_host_quick_writes_every_figure(tmp_path: Path) -> None:
    data = run_quick("host", tmp_path, timeout=280)
    assert data["quick"] is True and data["store"] == "sqlite"
    assert data["mode"] == {"single": "sync", "many": "batch"} and data["fsync_added_ms"] == 0
    sizes = data["sizes"]
    assert data["killed_by_sigkill"] is True  # the host died in flight, as a crash would
    for phase in ("single", "many"):
        figures = data[phase]
        assert figures["turns"] > 0 and figures["turns_per_s"] > 0, figures
        for key in ("commits_per_turn", "fsyncs_per_turn", "share_of_wall_in_fsync", "lag_p99_ms"):
            assert figures[key] is not None, (phase, key)
    assert data["single"]["turns"] == 2 * sizes["single_runs"] * data["turns_per_run"]
    assert data["many"]["turns"] == (
        sizes["running"] * sizes["runs_per_session"] * data["turns_per_run"]
    )
    assert data["send_acceptance"]["sends"] == sizes["running"] * sizes["runs_per_session"]
    assert 0 < data["send_acceptance"]["p50_ms"] <= data["send_acceptance"]["p99_ms"]
    assert data["send_acceptance"]["client_sends"] >= 1
    assert data["send_acceptance"]["client_p99_ms"] >= data["send_acceptance"]["client_p50_ms"] > 0
    assert data["ratios"]["many_vs_single_turns_per_s"] > 0
    rec = data["reconcile"]
    assert rec["sessions"] == rec["plans_known"] == sizes["sessions"], rec
    assert rec["needing_decision"] == sizes["sessions"] // 2  # the half held in a tool call
    assert rec["seconds_to_all_plans"] > 0
    assert len(data["targets"]) == 3 and all(t["value"] is not None for t in data["targets"])
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())
