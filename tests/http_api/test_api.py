"""The HTTP API through a real client against ``durable-harness serve --port 0``
(issue 12, "Must show"; ``design/http.md``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from .util import run_records, wait_state


def create(client: httpx.Client, workdir: Path, provider: str, **extra: Any) -> dict[str, Any]:
    resp = client.post("/sessions", json={"cwd": str(workdir), "provider": provider, **extra})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def send(client: httpx.Client, sid: str, message: str, **extra: Any) -> httpx.Response:
    return client.post(f"/sessions/{sid}/agent/send", json={"message": message, **extra})


@pytest.mark.slow
def test_create_send_status_while_running_steer_abort(start_server, script, workdir, tmp_path):
    gate = tmp_path / "gate"
    provider = script([{"text": "working on it", "wait_for": str(gate)}])
    server = start_server()
    with server.client() as c:
        sess = create(c, workdir, provider)
        sid = sess["id"]
        assert sess["state"] == "idle" and sess["generation"] == 1
        assert c.get(f"/sessions/{sid}").json()["state"] == "idle"

        resp = send(c, sid, "start")
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["run_id"]
        assert run_id

        status = wait_state(c, sid, "running")  # held open by the gate
        main = next(lane for lane in status["lanes"] if lane["lane"] == "main")
        assert main["run_id"] == run_id and main["live"] is True
        assert status["generation"] == 1 and status["plan"] is None

        steer = send(c, sid, "also check the docs", mode="steer")
        assert steer.status_code == 202, steer.text
        assert steer.json()["item_id"]

        aborted = c.post(f"/sessions/{sid}/agent/abort", json={})
        assert aborted.status_code == 200, aborted.text
        assert aborted.json()["lane"] == "main"

        wait_state(c, sid, "idle")
        finished = run_records(c, sid, "run_finished")
        assert [r["outcome"] for r in finished] == ["aborted"]
        assert run_records(c, sid, "abort_requested")
        # nothing open: a second abort and a steer are refused with their codes
        again = c.post(f"/sessions/{sid}/agent/abort", json={"lane": "main"})
        assert (again.status_code, again.json()["code"]) == (409, "no_open_run")
        late = send(c, sid, "too late", mode="steer")
        assert (late.status_code, late.json()["code"]) == (409, "no_open_run")


@pytest.mark.slow
def test_steer_enters_the_running_turn_and_messages_paginate(
    start_server, script, workdir, tmp_path
):
    gate = tmp_path / "gate"
    provider = script([{"text": "first answer", "wait_for": str(gate)}, {"text": "steered answer"}])
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, provider)["id"]
        assert send(c, sid, "begin").status_code == 202
        wait_state(c, sid, "running")
        assert send(c, sid, "STEER-TEXT", mode="steer").status_code == 202
        gate.touch()
        wait_state(c, sid, "idle")
        assert [r["outcome"] for r in run_records(c, sid, "run_finished")] == ["completed"]

        page = c.get(f"/sessions/{sid}/agent/messages").json()
        texts = [
            part.get("text")
            for entry in page["entries"]
            if entry.get("type") == "message"
            for part in entry["message"]["content"]
            if isinstance(part, dict)
        ]
        assert texts.index("begin") < texts.index("STEER-TEXT") < texts.index("steered answer")
        total = page["total"]
        second = c.get(f"/sessions/{sid}/agent/messages", params={"offset": 1, "limit": 2}).json()
        assert second["entries"] == page["entries"][1:3] and second["total"] == total
        bad = c.get(f"/sessions/{sid}/agent/messages", params={"limit": 0})
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_request")


@pytest.mark.slow
def test_close_keeps_transcript_resume_is_generation_2_forget_refused_while_live(
    start_server, script, workdir
):
    provider = script([{"text": "one"}, {"text": "two"}])
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, provider)["id"]
        assert send(c, sid, "hello").status_code == 202
        wait_state(c, sid, "idle")
        before = c.get(f"/sessions/{sid}/agent/messages").json()["entries"]
        assert len(before) == 2

        refused = c.request("DELETE", f"/sessions/{sid}", json={})
        assert (refused.status_code, refused.json()["code"]) == (409, "session_live")

        closed = c.post(f"/sessions/{sid}/close", json={})
        assert closed.status_code == 200 and closed.json()["state"] == "closed"
        assert c.post(f"/sessions/{sid}/close", json={}).json()["state"] == "closed"  # idempotent
        assert c.get(f"/sessions/{sid}").json()["state"] == "closed"
        assert c.get(f"/sessions/{sid}/agent/messages").json()["entries"] == before
        dead = send(c, sid, "anyone?")
        assert (dead.status_code, dead.json()["code"]) == (409, "session_not_live")

        resumed = c.post(f"/sessions/{sid}/resume", json={})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["id"] == sid and resumed.json()["generation"] == 2
        assert c.get(f"/sessions/{sid}").json()["generation"] == 2
        twice = c.post(f"/sessions/{sid}/resume", json={})
        assert (twice.status_code, twice.json()["code"]) == (409, "session_live")
        assert send(c, sid, "again").status_code == 202
        wait_state(c, sid, "idle")
        assert len(c.get(f"/sessions/{sid}/agent/messages").json()["entries"]) == 4

        assert c.request("DELETE", f"/sessions/{sid}", json={}).status_code == 409
        assert c.post(f"/sessions/{sid}/close", json={}).json()["state"] == "closed"
        transcript = Path(c.get(f"/sessions/{sid}").json()["transcript"])
        assert transcript.exists()
        assert c.request("DELETE", f"/sessions/{sid}", json={}).status_code == 204
        gone = c.get(f"/sessions/{sid}")
        assert (gone.status_code, gone.json()["code"]) == (404, "session_not_found")
        assert not transcript.exists()
        assert sid not in [s["id"] for s in c.get("/sessions").json()["sessions"]]


@pytest.mark.slow
def test_two_concurrent_prompts_give_exactly_one_409(start_server, script, workdir, tmp_path):
    gate = tmp_path / "gate"
    provider = script([{"text": "busy", "wait_for": str(gate)}])
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, provider)["id"]
    barrier = threading.Barrier(2)
    results: list[httpx.Response] = []

    def fire(text: str) -> None:
        with server.client() as own:
            barrier.wait()
            results.append(send(own, sid, text))

    threads = [threading.Thread(target=fire, args=(f"prompt {i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r.status_code for r in results) == [202, 409], [r.text for r in results]
    loser = next(r for r in results if r.status_code == 409)
    assert loser.json()["code"] == "run_in_progress"
    gate.touch()
    with server.client() as c:
        wait_state(c, sid, "idle")
        assert len(run_records(c, sid, "run_started")) == 1


@pytest.mark.slow
def test_idempotency_key_creates_and_sends_once(start_server, script, workdir):
    provider = script([{"text": "once"}])
    server = start_server()
    with server.client() as c:
        headers = {"Idempotency-Key": "create-1"}
        body = {"cwd": str(workdir), "provider": provider}
        first = c.post("/sessions", json=body, headers=headers)
        second = c.post("/sessions", json=body, headers=headers)
        assert first.status_code == second.status_code == 201
        sid = first.json()["id"]
        assert second.json()["id"] == sid and first.json()["client_key"] == "create-1"
        assert len(c.get("/sessions").json()["sessions"]) == 1

        key = {"Idempotency-Key": "send-1"}
        a = c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}, headers=key)
        wait_state(c, sid, "idle")
        b = c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}, headers=key)
        assert a.status_code == b.status_code == 202
        assert b.json()["duplicate"] is True and b.json()["run_id"] == a.json()["run_id"]
        assert len(run_records(c, sid, "run_started")) == 1
    server.stop()  # SIGTERM: the keys are durable, a restarted server honours them
    # a graceful stop, then uvicorn re-raises the signal so the parent sees how it ended
    assert server.proc.returncode == -15 and "Traceback" not in server.stderr(), server.stderr()
    again = start_server()
    with again.client() as c:
        wait_state(c, sid, "idle")  # reconciled and resumed by policy (no decision needed)
        third = c.post("/sessions", json=body, headers=headers)
        assert third.status_code == 201 and third.json()["id"] == sid
        assert len(c.get("/sessions").json()["sessions"]) == 1
        d = c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}, headers=key)
        assert d.json()["duplicate"] is True and d.json()["run_id"] == a.json()["run_id"]
        assert len(run_records(c, sid, "run_started")) == 1


def _sse_events(resp: httpx.Response, until: str) -> list[dict[str, str]]:
    events: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in resp.iter_lines():
        if not line:
            if "event" in current:
                events.append(current)
                if current["event"] == until:
                    return events
            current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        current[field] = value[1:] if value.startswith(" ") else value
    return events


@pytest.mark.slow
def test_event_stream_delivers_a_runs_events_in_order(start_server, script, workdir):
    import json

    provider = script(
        [
            {
                "text": "let me read",
                "tool_calls": [{"name": "read_file", "arguments": {"path": "f.txt"}}],
            },
            {"text": "the file says hi", "chunks": 3},
        ]
    )
    (workdir / "f.txt").write_text("hi")
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, provider)["id"]
        with c.stream("GET", f"/sessions/{sid}/agent/events") as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            with server.client() as other:
                run_id = send(other, sid, "read f.txt").json()["run_id"]
            events = _sse_events(resp, until="run_end")
        ids = [int(e["id"].split("-")[1]) for e in events]  # GENERATION-EVENTID
        assert ids == list(range(ids[0], ids[0] + len(ids))), ids  # consecutive, in order
        data = [json.loads(e["data"]) for e in events]
        assert all(
            e["id"] == f"{d['generation']}-{d['eventId']}"
            for d, e in zip(data, events, strict=True)
        )
        assert data[0] == {**data[0], "type": "lifecycle", "state": "running"}
        types = [e["event"] for e in events if e["event"] != "lifecycle"]
        assert types[0] == "run_start" and types[-1] == "run_end"
        for earlier, later in [
            ("run_start", "turn_start"),
            ("turn_start", "message_start"),
            ("message_start", "tool_execution_start"),
            ("tool_execution_start", "tool_execution_end"),
            ("tool_execution_end", "turn_end"),
        ]:
            assert types.index(earlier) < types.index(later), types
        assert types.count("turn_start") == 2
        assert data[-1]["outcome"] == "completed"
        assert all(d.get("runId") in (None, run_id) for d in data)

        # the stream ends when the generation stops
        with c.stream("GET", f"/sessions/{sid}/agent/events") as resp:
            with server.client() as other:
                assert other.post(f"/sessions/{sid}/close", json={}).status_code == 200
            tail = _sse_events(resp, until="never")
        assert (
            [json.loads(e["data"])["state"] for e in tail if e["event"] == "lifecycle"]
            == [
                "closing",
                "closed",
            ]
            or tail == []
            or tail[-1]["event"] == "lifecycle"
        )
        not_live = c.get(f"/sessions/{sid}/agent/events")
        assert (not_live.status_code, not_live.json()["code"]) == (409, "session_not_live")


@pytest.mark.slow
def test_second_server_resumes_a_session_closed_by_the_first(
    start_server, script, workdir, tmp_path
):
    provider = script([{"text": "from the first"}, {"text": "from the second"}])
    store = f"sqlite:{tmp_path / 'host.db'}"
    first = start_server(store)
    with first.client() as c:
        sid = create(c, workdir, provider)["id"]
        assert send(c, sid, "one").status_code == 202
        wait_state(c, sid, "idle")
        second = start_server(store)
        with second.client() as c2:
            # live in the first server: the second sees it and refuses to take it
            held = c2.post(f"/sessions/{sid}/resume", json={})
            assert (held.status_code, held.json()["code"]) == (409, "session_live")
            assert c.post(f"/sessions/{sid}/close", json={}).json()["state"] == "closed"
            assert c2.get(f"/sessions/{sid}").json()["state"] == "closed"
            resumed = c2.post(f"/sessions/{sid}/resume", json={})
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["generation"] == 2
            assert send(c2, sid, "two").status_code == 202
            wait_state(c2, sid, "idle")
            entries = c2.get(f"/sessions/{sid}/agent/messages").json()["entries"]
            assert len(entries) == 4
            # the first server now sees it held by the second
            taken = c.post(f"/sessions/{sid}/resume", json={})
            assert (taken.status_code, taken.json()["code"]) == (409, "session_live")


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


@pytest.mark.slow
def test_metrics_count_sessions_by_state_and_runs(start_server, script, workdir):
    provider = script([{"text": "ok"}])
    server = start_server()
    with server.client() as c:
        first = create(c, workdir, provider)["id"]
        second = create(c, workdir, provider)["id"]
        assert send(c, first, "go").status_code == 202
        wait_state(c, first, "idle")
        assert c.post(f"/sessions/{second}/close", json={}).status_code == 200
        resp = c.get("/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/plain")
        text = resp.text
        assert _metric(text, 'durable_harness_sessions{state="idle"}') == 1
        assert _metric(text, 'durable_harness_sessions{state="closed"}') == 1
        assert _metric(text, 'durable_harness_sessions{state="suspended"}') == 0
        assert _metric(text, 'durable_harness_runs_total{outcome="completed"}') == 1
        assert _metric(text, "durable_harness_tool_calls_awaiting_decision") == 0


@pytest.mark.slow
def test_token_from_the_environment_guards_a_loopback_server(start_server, script, workdir):
    server = start_server(env={"DURABLE_HARNESS_TOKEN": "from-env"})
    with server.client() as anon:
        assert anon.get("/sessions").status_code == 401
    with server.client(token="from-env") as c:
        assert c.get("/sessions").status_code == 200
        assert c.get("/openapi.json").json()["info"]["title"] == "durable-harness host"


@pytest.mark.slow
def test_decide_refuses_a_call_not_in_doubt(start_server, script, workdir):
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, script([{"text": "ok"}]))["id"]
        assert c.post(f"/sessions/{sid}/close", json={}).status_code == 200
        resp = c.post(
            f"/sessions/{sid}/agent/decide",
            json={"tool_call_id": "call_x_1_1", "decision": "retry"},
        )
        assert resp.status_code == 409, resp.text
        assert resp.json()["code"] == "recovery_error"
        assert c.get(f"/sessions/{sid}").json()["state"] == "closed"
