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

# the resumed provider turn streams 3 chunks, 1 s apart: the resume holds the lease ~3 s
SLOW = [{"text": "A slow answer, streamed.", "delay": 1.0, "chunks": 3}]


# long enough for several fresh processes to look at the session while it runs (~6 s)
SLOWER = [{"text": "A slower answer, streamed.", "delay": 2.0, "chunks": 3}]


def _crashed(tmp_path: Path, backend: str, turns: list[dict[str, object]]) -> tuple[str, str]:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    script = write_script(tmp_path / "script.json", turns)
    first = dh(
        "run", "slow", "--provider", f"scripted:{script}", "--store", spec, "--cwd", str(work),
        crash_at="after_run_started",
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    return spec, session_id(first)


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_resumes_one_proceeds(backend: str, tmp_path: Path) -> None:
    spec, sid = _crashed(tmp_path, backend, SLOW)
    procs = [popen("resume", sid, "--store", spec) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
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
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_recover_while_lease_held_reports_running(backend: str, tmp_path: Path) -> None:
    spec, sid = _crashed(tmp_path, backend, SLOWER)
    before = main_lane(plan_json(sid, spec))
    assert (before["state"], before["next_action"]) == ("suspended", "issue_provider_request")

    live = popen("resume", sid, "--store", spec)
    try:
        seen = None
        deadline = time.monotonic() + 20
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
        out, err = live.communicate(timeout=60)
    assert live.returncode == 0, out + err
    assert "lane main: completed" in out
    after = main_lane(plan_json(sid, spec))
    assert (after["state"], after["next_action"]) == ("idle", "none")
