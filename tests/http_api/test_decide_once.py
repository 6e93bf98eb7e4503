"""A decision on record is never replaced (issue 20), and the listing shows what waits.

A real server runs a turn with two replay-never bash calls (run at once) and is SIGKILLed
after both effects, neither settled; restarted on the same store,
``GET /sessions?state=suspended`` lists the session with both in-doubt calls straight away.
Deciding one ``result:...`` keeps the session suspended (the other still waits); a second
decision for it (``retry``) is 409 ``already_decided`` naming the call and the decision on
record, writes nothing, and re-runs nothing: each effect happened exactly once.
"""

from __future__ import annotations

import re

import pytest

from .util import poll, run_records, snapshot


def command(effects, mine: str, other: str) -> str:
    """Append ``mine``, then wait until the other call's effect is there too: whichever call
    ends first hits the crash point with both effects done and neither call settled."""
    return f"echo {mine} >> {effects}; until grep -q {other} {effects}; do sleep 0.01; done"


def _two_calls(script, workdir):
    effects = workdir / "effects.log"
    calls = [
        {"id": f"call_{n}", "name": "bash", "arguments": {"command": command(effects, n, o)}}
        for n, o in (("a", "b"), ("b", "a"))
    ]
    return script([{"text": "", "tool_calls": calls}, {"text": "done"}]), effects


@pytest.mark.crash
@pytest.mark.timeout(180)
def test_a_second_decision_is_409_already_decided_and_runs_nothing(
    start_server, script, workdir, tmp_path
):
    provider, effects = _two_calls(script, workdir)
    store_dir = tmp_path / "store"
    crashing = start_server(None, env={"DURABLE_HARNESS_CRASH_AT": "after_tool_effect"})
    with crashing.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
        poll(lambda: crashing.proc.poll() is not None, "the crash point to SIGKILL the server")
    assert sorted(effects.read_text().split()) == ["a", "b"]

    server = start_server()
    with server.client() as c:
        # straight after the restart: filtered by state, with the calls that wait
        listed = c.get("/sessions", params={"state": "suspended"})
        assert listed.status_code == 200, listed.text
        (row,) = listed.json()["sessions"]
        assert (row["id"], row["state"]) == (sid, "suspended")
        waiting = {w["tool_call_id"]: w for w in row["waiting"]}
        assert set(waiting) == {"call_a", "call_b"}
        assert waiting["call_a"]["tool_name"] == "bash"
        assert waiting["call_a"]["arguments"] == {"command": command(effects, "a", "b")}
        assert waiting["call_a"]["attempt"] == 1
        # the same plain words and title the console shows (recovery/explain.py)
        assert row["title"] == "go"
        assert re.fullmatch(
            r"started before the crash at \d\d:\d\d; no result was recorded; "
            "this tool is not safe to run twice",
            waiting["call_a"]["why"],
        ), waiting["call_a"]["why"]
        assert c.get("/sessions", params={"state": ["idle", "closed"]}).json()["sessions"] == []
        both = c.get("/sessions", params={"state": ["idle", "suspended"]}).json()["sessions"]
        assert [s["id"] for s in both] == [sid]
        bad = c.get("/sessions", params={"state": "waiting"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
        assert "suspended" in bad.json()["message"]

        first = c.post(
            f"/sessions/{sid}/agent/decide",
            json={"tool_call_id": "call_a", "decision": "result:a was appended"},
        )
        assert first.status_code == 200, first.text
        assert first.json()["state"] == "suspended"  # call_b still waits
        (row,) = c.get("/sessions", params={"state": "suspended"}).json()["sessions"]
        assert [w["tool_call_id"] for w in row["waiting"]] == ["call_b"]

        before = snapshot(store_dir)
        second = c.post(
            f"/sessions/{sid}/agent/decide", json={"tool_call_id": "call_a", "decision": "retry"}
        )
        assert second.status_code == 409, second.text
        body = second.json()
        assert body["code"] == "already_decided"
        assert (body["tool_call_id"], body["attempt"]) == ("call_a", 1)
        assert body["on_record"]["decision"] == "result"
        assert body["on_record"]["result"] == "a was appended"
        assert body["given"] == {"decision": "retry"}
        assert "call_a" in body["message"] and "already decided" in body["message"]
        assert snapshot(store_dir) == before  # nothing written, not even the lease taken
        assert c.get(f"/sessions/{sid}").json()["state"] == "suspended"

        third = c.post(
            f"/sessions/{sid}/agent/decide",
            json={"tool_call_id": "call_b", "decision": "result:b was appended"},
        )
        assert third.status_code == 200, third.text
        poll(
            lambda: [r["outcome"] for r in run_records(c, sid, "run_finished")] == ["completed"],
            "the run to finish",
        )
        decisions = run_records(c, sid, "decision")
        assert [(d["toolCallId"], d["decision"], d["attempt"]) for d in decisions] == [
            ("call_a", "result", 1),
            ("call_b", "result", 1),
        ]
        assert len(run_records(c, sid, "tool_started")) == 2  # nothing re-ran
    assert sorted(effects.read_text().split()) == ["a", "b"]  # each effect exactly once
