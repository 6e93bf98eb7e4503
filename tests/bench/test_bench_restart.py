"""Smoke test of ``python -m bench restart --quick``: a host SIGKILLed with sessions in flight,
restarted by fresh serving processes in both arms; every figure the issue asks for is written
(no figure's value is asserted: speed targets live in ``bench/``)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .util import run_quick

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(600)]


def test_bench_restart_quick_writes_every_figure(tmp_path: Path) -> None:
    data = run_quick("restart", tmp_path, timeout=580)
    restart = data["restart"]
    n = restart["sessions"]
    assert data["quick"] is True and restart["host_exit"] == -signal.SIGKILL
    for arm in ("before", "now"):
        figures = restart[arm]
        for key in ("plans_s", "serving_s", "all_resumed_s", "serving_vs_plans"):
            assert figures[key] is not None and figures[key] > 0, (arm, key)
        assert figures["queued_resumes"] == n // 2  # the half held in the provider's stream
        assert figures["live_after"] == n // 2
        assert figures["sessions_listed"] == n and figures["resumes_pending_after"] == 0
    assert data["ratios"]["serving_vs_plans_now"] is not None
    if data["reconnect"] is not None:  # the PostgreSQL server binaries are installed
        for arm in ("before", "now"):
            assert data["reconnect"][arm].get("reconnected_s") is not None, data["reconnect"]
