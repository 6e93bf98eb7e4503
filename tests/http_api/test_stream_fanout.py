"""Readers do not slow writers (issue 22, ``design/http.md``, "Events"): a client that opens an
event stream and never reads does not hold the run; once it has fallen more than the kept
events behind it is dropped with a ``dropped`` notice, and a reconnect with its last id gets
the ``gap`` notice and what is kept; with every stream slot taken a run still finishes and one
more stream is refused. A real server, real HTTP clients, real sockets."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from durable_harness.host.process import REPLAY_EVENTS
from durable_harness.http.streams import MAX_EVENT_STREAMS

from .test_api import create, send
from .util import open_raw_stream, run_records, wait_state

# 1.3-1.7 s each in `make check`'s lane on 2 quiet cores (7 Dec): they run in `make test`
pytestmark = pytest.mark.slow

CHUNKS = REPLAY_EVENTS + 476  # one answer streamed in more deltas than a generation keeps
CHUNK_CHARS = 2000  # each delta's size: together far more than the sockets buffer


def _frames(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """The SSE events of ``resp`` as ``{"id", "event", "data"}`` (``data`` parsed)."""
    current: dict[str, Any] = {}
    for line in resp.iter_lines():
        if not line:
            if "event" in current:
                current["data"] = json.loads(current["data"])
                yield current
            current = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            current[name] = value[1:] if value.startswith(" ") else value


def _small_buffer_client(url: str) -> httpx.Client:
    """A client whose sockets buffer little (so a server writing to one that is not read
    soon has to wait for it)."""
    transport = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    return httpx.Client(base_url=url, transport=transport, timeout=60.0)


def test_a_reader_reading_nothing_does_not_hold_the_run_and_is_dropped_with_a_notice(
    start_server, script, workdir
):
    provider = script([{"text": "x" * (CHUNKS * CHUNK_CHARS), "chunks": CHUNKS}])
    server = start_server()
    sid = create_idle(server, workdir, provider)
    events = f"/sessions/{sid}/agent/events"
    with server.client() as c, _small_buffer_client(server.url) as idle_c:
        with idle_c.stream("GET", events) as idle:
            assert idle.status_code == 200
            # nothing of `idle` is read while the run streams its answer and ends
            assert send(c, sid, "go").status_code == 202
            wait_state(c, sid, "idle")
            (finished,) = run_records(c, sid, "run_finished")
            assert finished["outcome"] == "completed"
            frames = list(_frames(idle))  # now read: what it got, then the stream's end
        *got, notice = frames
        generation = c.get(f"/sessions/{sid}").json()["generation"]
        ids = [int(f["id"].split("-")[1]) for f in got]
        assert ids == list(range(ids[0], ids[0] + len(ids))), "in order, none skipped"
        assert all(f["id"].startswith(f"{generation}-") for f in got)
        assert notice["event"] == "dropped" and "id" not in notice
        assert notice["data"] == {
            "type": "dropped",
            "reason": "behind",
            "after": [generation, ids[-1]],
            "kept_from": notice["data"]["kept_from"],
            "limit": REPLAY_EVENTS,
        }
        kept_from = notice["data"]["kept_from"]
        assert kept_from[0] == generation and kept_from[1] > ids[-1] + 1
        # reconnecting after the last event it got: the gap notice, then what is kept
        with c.stream("GET", events, headers={"Last-Event-ID": got[-1]["id"]}) as again:
            resumed = again_until_run_end(_frames(again))
        gap, *rest = resumed
        assert gap["event"] == "gap" and "id" not in gap
        assert gap["data"]["reason"] == "dropped"
        assert gap["data"]["after"] == [generation, ids[-1]]
        first = gap["data"]["resumes"]
        assert first[0] == generation and first[1] >= kept_from[1]
        rest_ids = [int(f["id"].split("-")[1]) for f in rest]
        assert rest_ids == list(range(first[1], first[1] + len(rest_ids)))
        assert rest[-1]["event"] == "run_end"


def create_idle(server: Any, workdir: Any, provider: str) -> str:
    """Create a session and wait until it is idle; its id."""
    with server.client() as c:
        sid: str = create(c, workdir, provider)["id"]
        wait_state(c, sid, "idle")
    return sid


def again_until_run_end(frames: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames up to the first ``run_end``, included."""
    out = []
    for frame in frames:
        out.append(frame)
        if frame["event"] == "run_end":
            break
    return out


def _open_unread(url: str, path: str) -> socket.socket:
    """An event stream on a raw socket with a small buffer that reads its status line and
    nothing more."""
    sock, status = open_raw_stream(url, path, rcvbuf=4096)
    assert b" 200 " in status, status
    return sock


def test_a_run_finishes_with_every_stream_slot_held_by_readers_reading_nothing(
    start_server, script, workdir
):
    (workdir / "f").write_text("hi")
    read = {"name": "read_file", "arguments": {"path": "f"}}
    turns = [
        {"text": "checking", "chunks": 8, "tool_calls": [read]},
        {"text": "checked, all of it", "chunks": 8},
    ]
    server = start_server()
    sid = create_idle(server, workdir, script(turns))
    path = f"/sessions/{sid}/agent/events"
    socks = [_open_unread(server.url, path) for _ in range(MAX_EVENT_STREAMS)]
    try:
        with server.client() as c:
            refused = c.get(path)
            assert refused.status_code == 503
            assert refused.json()["code"] == "too_many_streams"
            assert send(c, sid, "go").status_code == 202
            wait_state(c, sid, "idle")
            (finished,) = run_records(c, sid, "run_finished")
            assert finished["outcome"] == "completed"
            assert c.get(path).status_code == 503  # the readers still hold their slots
    finally:
        for sock in socks:
            sock.close()


def test_readers_that_read_get_every_event_of_a_fast_run_while_the_streams_pause(
    start_server, script, workdir
):
    """With most slots taken the streams pause up to half a second between writes. A run
    publishing several times the kept events faster than that, in bursts of over 525 events
    without a pause of its event loop between them (a provider's turn: the deltas of one
    read of its stream), still reaches every reader that reads, in order and whole: a
    pausing stream is woken when it is half the kept events behind, and the other half
    covers a burst published before it runs again (``design/http.md``, "Events")."""
    (workdir / "f").write_text("hi")
    read = {"name": "read_file", "arguments": {"path": "f"}}
    burst = 525  # two bursts pass the limit: a wake at three quarters of it would drop one
    turns = [{"text": "y" * burst, "chunks": burst, "tool_calls": [read]} for _ in range(6)]
    turns.append({"text": "done", "chunks": 1})
    server = start_server()
    sid = create_idle(server, workdir, script(turns))
    path = f"/sessions/{sid}/agent/events"
    socks = [_open_unread(server.url, path) for _ in range(MAX_EVENT_STREAMS - 8)]
    got: list[list[dict[str, Any]]] = [[] for _ in range(4)]
    opened = threading.Barrier(len(got) + 1)

    def read(into: list[dict[str, Any]]) -> None:
        with httpx.Client(base_url=server.url, timeout=60.0) as rc, rc.stream("GET", path) as r:
            assert r.status_code == 200
            opened.wait()
            into.extend(again_until_run_end(_frames(r)))

    threads = [threading.Thread(target=read, args=(into,)) for into in got]
    try:
        for t in threads:
            t.start()
        opened.wait(timeout=30)
        with server.client() as c:
            assert send(c, sid, "go").status_code == 202
            wait_state(c, sid, "idle")
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
    finally:
        for sock in socks:
            sock.close()
    for frames in got:
        assert [f for f in frames if f["event"] in ("dropped", "gap")] == []
        ids = [int(f["id"].split("-")[1]) for f in frames]
        assert ids == list(range(ids[0], ids[0] + len(ids))), "in order, none skipped"
        assert frames[-1]["event"] == "run_end"
        assert len(ids) > 6 * burst > 2 * REPLAY_EVENTS
