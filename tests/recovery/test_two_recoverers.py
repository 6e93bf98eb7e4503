"""Two recoverers at once: the writer lease lets exactly one ``resume`` proceed; the other is
refused with the lease error. And ``recover`` while a live process holds the lease reports
the lane as running and recovers nothing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from .helpers import (
    BACKENDS,
    dh,
    main_lane,
    plan_json,
    popen,
    read_session,
    session_id,
    store_spec,
    write_script,
)

# Waiting for a state, never for a speed: a process that must still be running later gets this
# long to show up or finish, far more than it needs on a loaded machine.
PATIENCE = 60.0


def _held_turns(gate: Path) -> list[dict[str, object]]:
    """One provider turn that, after its first chunk, waits until ``gate`` exists: the resume
    holds the lease, mid-run, until the test has seen what it needs."""
    return [{"text": "A held answer, streamed.", "chunks": 3, "wait_for": str(gate)}]


def _crashed(tmp_path: Path, backend: str, gate: Path) -> tuple[str, str]:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    script = write_script(tmp_path / "script.json", _held_turns(gate))
    first = dh(
        "run", "slow", "--provider", f"scripted:{script}", "--store", spec, "--cwd", str(work),
        crash_at="after_run_started",
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    return spec, session_id(first)


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_resumes_one_proceeds(backend: str, tmp_path: Path) -> None:
    gate = tmp_path / "release"
    spec, sid = _crashed(tmp_path, backend, gate)
    procs = [popen("resume", sid, "--store", spec) for _ in range(2)]
    try:
        # the winner holds the lease at the gate, so the loser ends first, refused
        deadline = time.monotonic() + PATIENCE
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(p.poll() is not None for p in procs), "neither resume ended"
    finally:
        gate.touch()
    outs = [p.communicate(timeout=PATIENCE) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], (codes, outs)
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    assert "lane main: completed" in outs[winner][0]
    err = outs[loser][1]
    assert "lease_held" in err
    assert "open for writing by another live process" in err
    assert "lane main" not in outs[loser][0]  # the loser did nothing

    records, _entries, _loc = read_session(spec, sid)
    # exactly one provider attempt and one finished run: the loser wrote nothing
    assert len([r for r in records if r["type"] == "provider_request_started"]) == 1
    assert [r["outcome"] for r in records if r["type"] == "run_finished"] == ["completed"]


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_recover_while_lease_held_reports_running(backend: str, tmp_path: Path) -> None:
    gate = tmp_path / "release"
    spec, sid = _crashed(tmp_path, backend, gate)
    before = main_lane(plan_json(sid, spec))
    assert (before["state"], before["next_action"]) == ("suspended", "issue_provider_request")

    live = popen("resume", sid, "--store", spec)
    try:
        seen = None
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline and live.poll() is None:
            plan = plan_json(sid, spec)
            # the holder's details are written just after its flock is taken: in that
            # instant a reader sees the lock held but the previous holder's (or no) pid
            if plan["lease"] is not None and plan["lease"].get("pid") == live.pid:
                seen = plan
                break
            time.sleep(0.05)
        assert seen is not None, "recover never saw the live resume's lease"
        lane = main_lane(seen)
        assert lane["state"] == "running"
        assert lane["next_action"] == "none_held_by_live_process"
        assert lane["run_id"] == before["run_id"]
        # the plain-text form says so too, and a second writer is refused meanwhile
        text = dh("recover", sid, "--store", spec)
        assert "lease held by live process" in text.stdout
        second = dh("resume", sid, "--store", spec)
        assert second.returncode == 2
        assert "lease_held" in second.stderr
    finally:
        gate.touch()
        out, err = live.communicate(timeout=PATIENCE)
    assert live.returncode == 0, out + err
    assert "lane main: completed" in out
    after = main_lane(plan_json(sid, spec))
    assert (after["state"], after["next_action"]) == ("idle", "none")
