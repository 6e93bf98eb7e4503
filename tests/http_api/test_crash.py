"""The server SIGKILLed mid-tool with many sessions running, restarted on the same store
(issue 12, "Must show"): every session is ``suspended`` with its plan before the server
answers, those needing no decision then resumed by policy in the background (issue 22: queued,
``resume_pending``, or already live); no replay-never tool re-ran; each in-doubt call is
decided through the API and every run finishes, each tool's effect done exactly once."""

from __future__ import annotations

import json

import pytest

from .util import make_sessions, poll, run_records

SESSIONS = 20
CRASH_AT = 10  # the 10th tool start of the server SIGKILLs it


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_killed_mid_tool_restarts_with_plans_and_decisions_finish_the_runs(
    start_server, script, tmp_path
):
    gate = tmp_path / "gate"
    provider = script(
        [
            {
                "text": "running the effect",
                "wait_for": str(gate),
                "tool_calls": [{"name": "bash", "arguments": {"command": "printf x >> effect"}}],
            },
            {"text": "done"},
        ]
    )
    store = f"sqlite:{tmp_path / 'host.db'}"
    crashing = start_server(
        store, env={"DURABLE_HARNESS_CRASH_AT": f"after_tool_started:{CRASH_AT}"}
    )
    dirs = make_sessions(crashing, SESSIONS, tmp_path, provider)
    with crashing.client() as c:
        poll(
            lambda: all(c.get(f"/sessions/{s}").json()["state"] == "running" for s in dirs),
            "every session running",
        )
        gate.touch()
        poll(lambda: crashing.proc.poll() is not None, "the crash point to SIGKILL the server")
    assert crashing.proc.returncode == -9
    effects_at_crash = {
        sid: (d / "effect").read_text() if (d / "effect").exists() else ""
        for sid, d in dirs.items()
    }

    restarted = start_server(store, "--resume-concurrency", "1")  # one resume at a time
    with restarted.client() as c:
        # the first answer already sees every crashed session reconciled
        sessions = {s["id"]: s for s in c.get("/sessions").json()["sessions"]}
        assert sessions.keys() == dirs.keys()
        states = {sid: s["state"] for sid, s in sessions.items()}
        # (issue 22) a background resume in progress reads "creating" until its generation is up
        assert set(states.values()) <= {"suspended", "creating", "idle", "running"}, states
        # a suspended session either waits for a decision or (issue 22) its resume is queued;
        # only the first kind counts as awaiting a decision
        suspended = [s for s, st in states.items() if st == "suspended" and sessions[s]["waiting"]]
        assert suspended, "the call started at the crash is in doubt and waits for a decision"
        assert all(sessions[sid]["resume_pending"] is None for sid in suspended)
        metrics = c.get("/metrics").text
        awaiting = [
            line
            for line in metrics.splitlines()
            if line.startswith("durable_harness_tool_calls_awaiting_decision ")
        ]
        assert awaiting and float(awaiting[0].split()[1]) >= len(suspended)
        queued = [
            ln for ln in metrics.splitlines() if ln.startswith("durable_harness_resumes_pending ")
        ]
        assert queued and float(queued[0].split()[1]) >= 0  # the start-up queue, as scraped

        decided = 0
        for sid in suspended:
            status = c.get(f"/sessions/{sid}/agent/status").json()
            assert status["state"] == "suspended" and status["plan"] is not None
            waiting = [
                call
                for lane in status["plan"]["lanes"]
                for call in lane["tool_calls"]
                if call["action"] == "await_decision"
            ]
            assert [w["tool_name"] for w in waiting] == ["bash"], json.dumps(status["plan"])
            # nothing re-ran the replay-never tool on its own
            effect = dirs[sid] / "effect"
            assert (effect.read_text() if effect.exists() else "") == effects_at_crash[sid]
            for call in waiting:
                # as a person would: look at the effect, then say what happened
                decision = "result:x was appended (checked by hand)" if effect.exists() else "retry"
                resp = c.post(
                    f"/sessions/{sid}/agent/decide",
                    json={"tool_call_id": call["tool_call_id"], "decision": decision},
                )
                assert resp.status_code == 200, resp.text
                decided += 1
        assert decided >= 1

        def all_finished() -> bool:
            return all(
                c.get(f"/sessions/{sid}").json()["state"] == "idle"
                and [r["outcome"] for r in run_records(c, sid, "run_finished")] == ["completed"]
                for sid in dirs
            )

        poll(all_finished, "every run to finish", timeout=120)
        for sid, cwd in dirs.items():
            assert (cwd / "effect").read_text() == "x", sid  # exactly once
