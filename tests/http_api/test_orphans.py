"""A ``bash`` group left running by a SIGKILLed ``serve``, and the operator's kill route
(``design/host.md``, "What happens to a running tool's group"), through a real server and a
real HTTP client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.tools.processes import group_alive

from .util import Server, poll, run_records, wait_state

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

JSON = {"Content-Type": "application/json"}


def test_serve_sigkilled_mid_bash_kills_the_old_group_before_it_answers(
    start_server: Callable[..., Server], script: Callable[..., str], workdir: Path
) -> None:
    # held on a gate, not a sleep: a slow restart (a second suite on the same cores) must not
    # let the command finish on its own before the new server could kill it
    command = (
        "echo started > started; while [ ! -e gate ]; do sleep 0.05; done; echo landed > landed"
    )
    provider = script(
        [{"text": "Long job.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}]
    )
    first = start_server()
    with first.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
        poll(lambda: (workdir / "started").exists(), "the command to start")
        (proc,) = poll(lambda: run_records(c, sid, "tool_process"), "the tool_process record")
    first.proc.kill()
    first.proc.wait(timeout=30)
    group = (proc["pgid"], proc["startTime"])
    assert group_alive(*group), "the bash group should outlive its server"

    second = start_server()  # returns once the server answers
    assert not group_alive(*group), "the old group outlived start-up reconciliation"
    with second.client() as c:
        (killed,) = run_records(c, sid, "tool_process_killed")
        assert (killed["pgid"], killed["by"], killed["toolCallId"]) == (
            proc["pgid"],
            "reconcile",
            proc["toolCallId"],
        )
        status = wait_state(c, sid, "suspended")
        (call,) = status["plan"]["lanes"][0]["tool_calls"]
        assert (call["status"], call["action"]) == ("in_doubt", "await_decision")
        assert call["process"] is None  # known dead: nothing left running
    (workdir / "gate").touch()  # a command still alive would now land its effect
    end = time.monotonic() + 1.5
    while time.monotonic() < end:  # past the gate: the effect never lands
        assert not (workdir / "landed").exists()
        time.sleep(0.05)


def test_the_kill_route_kills_a_running_group_and_records_it(
    start_server: Callable[..., Server], script: Callable[..., str], workdir: Path
) -> None:
    command = "echo started > started; sleep 60; echo landed > landed"
    provider = script(
        [
            {
                "text": "Long job.",
                "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
            },
            {"text": "Stopped."},
        ]
    )
    server = start_server()
    with server.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
        poll(lambda: (workdir / "started").exists(), "the command to start")
        (proc,) = poll(lambda: run_records(c, sid, "tool_process"), "the tool_process record")

        unknown = c.post(
            f"/sessions/{sid}/agent/kill", json={"tool_call_id": "no-such-call"}, headers=JSON
        )
        assert unknown.status_code == 400, unknown.text
        assert unknown.json()["code"] == "invalid_request"

        resp = c.post(
            f"/sessions/{sid}/agent/kill",
            json={"tool_call_id": proc["toolCallId"]},
            headers=JSON,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json() == {
            "tool_call_id": proc["toolCallId"],
            "pgid": proc["pgid"],
            "killed": True,
        }
        assert not group_alive(proc["pgid"], proc["startTime"])
        (killed,) = run_records(c, sid, "tool_process_killed")
        assert (killed["by"], killed["pgid"]) == ("operator", proc["pgid"])
        wait_state(c, sid, "idle")  # the tool saw its group die; the run went on
        assert not (workdir / "landed").exists()


def test_serve_close_grace_bounds_a_close_whose_bash_ignores_sigterm(
    start_server: Callable[..., Server], script: Callable[..., str], workdir: Path
) -> None:
    grace = 1.0
    command = "trap 'echo term >> got' TERM; echo started > started; while :; do sleep 0.05; done"
    provider = script(
        [
            {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": "."},
        ]
    )
    server = start_server(None, "--close-grace", str(grace))
    with server.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
        poll(lambda: (workdir / "started").exists(), "the command to start")
        (proc,) = poll(lambda: run_records(c, sid, "tool_process"), "the tool_process record")
        began = time.monotonic()
        closed = c.post(f"/sessions/{sid}/close", headers=JSON)
        took = time.monotonic() - began
        assert closed.status_code == 200, closed.text
        assert closed.json()["state"] == "closed"
    assert "term" in (workdir / "got").read_text()  # SIGTERM first, ignored
    assert not group_alive(proc["pgid"], proc["startTime"])  # then SIGKILL
    assert grace - 0.1 <= took <= grace + 2.0, took
