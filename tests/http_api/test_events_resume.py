"""``GET /sessions/{id}/agent/events`` honours ``Last-Event-ID``: a reader that disconnects
and reconnects with the id of the last event it saw gets exactly the rest, in order, none twice
(``design/http.md``, "Events"). A real server on port 0, a real HTTP client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .test_api import create, send
from .util import wait_state


def _frames(resp: httpx.Response) -> Iterator[dict[str, str]]:
    """The SSE events of ``resp`` as ``{field: value}`` (comments skipped)."""
    current: dict[str, str] = {}
    for line in resp.iter_lines():
        if not line:
            if "event" in current:
                yield current
            current = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        current[name] = value[1:] if value.startswith(" ") else value


def _read(frames: Iterator[dict[str, str]], until: str) -> list[dict[str, str]]:
    """The next frames of ``frames`` up to the first of type ``until``, included."""
    out: list[dict[str, str]] = []
    for frame in frames:
        out.append(frame)
        if frame["event"] == until:
            break
    return out


def _events_url(sid: str) -> str:
    return f"/sessions/{sid}/agent/events"


def _data(frames: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [json.loads(f["data"]) for f in frames]


@pytest.mark.slow
def test_a_reconnect_with_last_event_id_gets_exactly_the_rest(
    start_server, script, workdir, tmp_path
):
    gate = tmp_path / "gate"
    provider = script(
        [
            {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "f"}}]},
            {"text": "the file says hi", "chunks": 4, "wait_for": str(gate)},
        ]
    )
    (workdir / "f").write_text("hi")
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, provider)["id"]
        with (
            server.client() as whole_c,
            whole_c.stream("GET", _events_url(sid)) as whole,
            server.client() as part_c,
        ):
            with part_c.stream("GET", _events_url(sid)) as resp:
                part = _frames(resp)
                assert send(c, sid, "read f").status_code == 202
                # the second turn's first chunk arrives, then the provider waits at the gate
                first = _read(part, until="tool_execution_end")
                first += _read(part, until="message_update")
            # disconnected; the rest of the run happens while nobody reads on that side
            gate.touch()
            wait_state(c, sid, "idle")
            last = first[-1]["id"]
            with part_c.stream("GET", _events_url(sid), headers={"Last-Event-ID": last}) as again:
                assert again.status_code == 200
                rest = _read(_frames(again), until="run_end")
            everything = _read(_frames(whole), until="run_end")

    assert all("id" in f for f in first + rest)  # no gap notice: nothing was lost
    ids = [f["id"] for f in first + rest]
    assert len(set(ids)) == len(ids)  # none twice
    assert ids == [f["id"] for f in everything]  # exactly what a reader that stayed saw
    assert _data(first + rest) == _data(everything)
    numbers = [int(i.split("-")[1]) for i in ids]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # in order, no hole
    assert rest[0]["id"] == f"1-{int(last.split('-')[1]) + 1}"
    assert _data(rest)[-1]["outcome"] == "completed"


@pytest.mark.slow
def test_an_id_of_an_earlier_generation_resumes_at_this_ones_start(start_server, script, workdir):
    server = start_server()
    with server.client() as c:
        sid = create(c, workdir, script([{"text": "one"}, {"text": "two"}]))["id"]
        with c.stream("GET", _events_url(sid)) as resp:
            assert send(c, sid, "one").status_code == 202
            gen1 = _read(_frames(resp), until="run_end")
        assert c.post(f"/sessions/{sid}/close", json={}).status_code == 200
        assert c.post(f"/sessions/{sid}/resume", json={}).json()["generation"] == 2
        headers = {"Last-Event-ID": gen1[-1]["id"]}
        with c.stream("GET", _events_url(sid), headers=headers) as resp:
            frames = _read(_frames(resp), until="lifecycle")
        gap, first = frames
        assert "id" not in gap and gap["event"] == "gap"
        assert json.loads(gap["data"]) == {
            "type": "gap",
            "reason": "generation",
            "after": [1, int(gen1[-1]["id"].split("-")[1])],
            "resumes": [2, 1],
        }
        assert first["id"] == "2-1"
        assert json.loads(first["data"])["state"] == "idle"

        for bad in ("nonsense", "1", "-1-2", "3-1", "2-999999"):
            resp = c.get(_events_url(sid), headers={"Last-Event-ID": bad})
            assert resp.status_code == 400, (bad, resp.text)
            assert resp.json()["code"] == "invalid_request"
        assert c.post(f"/sessions/{sid}/close", json={}).status_code == 200
