"""Hostile input to the HTTP API (a tester's findings): each a clear 4xx with a stable code
and the JSON error body, never a 500 (``design/http.md``)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from durable_harness.http.streams import MAX_EVENT_STREAMS

from .util import poll, wait_state

pytestmark = [pytest.mark.timeout(120)]


def _error(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text[:2000])
    body = resp.json()
    assert body["code"] == code, body
    assert body["message"]
    return body


def _raw_json(c: httpx.Client, path: str, text: str, **headers: str) -> httpx.Response:
    """POST ``text`` as the body as it is (``json=`` cannot carry a lone surrogate)."""
    return c.post(
        path, content=text.encode(), headers={"content-type": "application/json", **headers}
    )


def test_unencodable_and_over_long_paths_are_invalid_requests(start_server, script, workdir):
    server = start_server()
    provider = script([{"text": "x"}])
    with server.client() as c:
        for body in (
            '{"cwd": "/tmp/\\ud800"}',
            json.dumps({"cwd": str(workdir), "provider": "x"})[:-1] + ', "mode": "\\udfff"}',
            json.dumps({"cwd": str(workdir)})[:-1] + ', "provider": "scripted:/tmp/\\ud800"}',
            json.dumps({"cwd": str(workdir)})[:-1] + ', "provider": "openai:\\ud800"}',
        ):
            err = _error(_raw_json(c, "/sessions", body), 400, "invalid_request")
            assert "surrogate" in err["message"] or "unicode" in err["message"], err
            if "ud800" in body:
                assert "\\ud800" in err["message"], err  # escaped, not dropped
        err = _error(c.post("/sessions", json={"cwd": "/" + "a" * 5000}), 400, "invalid_request")
        assert "limit is 4096" in err["message"]
        assert len(err["message"]) < 1000
        err = _error(c.post("/sessions", json={"cwd": "/" + "a" * 300}), 400, "invalid_request")
        assert "component over 255" in err["message"]
        err = _error(c.post("/sessions", json={"cwd": "/tmp/a\u0000b"}), 400, "invalid_request")
        assert "NUL" in err["message"]
        err = _error(
            c.post("/sessions", json={"cwd": str(workdir), "provider": "scripted:/" + "p" * 5000}),
            400,
            "format_error",
        )
        # a lone surrogate in a path parameter or a lane is refused, rendered
        _error(
            _raw_json(c, "/sessions/abc/agent/send", '{"message": "x", "lane": "\\ud800"}'),
            400,
            "invalid_request",
        )
        assert (
            c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).status_code == 201
        )


def test_only_loopback_host_headers_reach_a_tokenless_server(start_server):
    server = start_server()
    with server.client() as c:
        for path in ("/sessions", "/", "/console/login", "/openapi.json"):
            for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example", ""):
                err = _error(c.get(path, headers={"Host": host}), 400, "host_not_allowed")
                assert "not allowed" in err["message"]
        for host in (
            "localhost",
            "LOCALHOST:1234",
            "127.0.0.1",
            "127.0.0.1:9",
            "[::1]",
            "[::1]:80",
        ):
            assert c.get("/sessions", headers={"Host": host}).status_code == 200, host
    # with a token the token guards it (a rebinding page has no token)
    guarded = start_server(None, token="s3cret")
    with guarded.client() as c:
        assert c.get("/sessions", headers={"Host": "example.net"}).status_code == 200


def test_a_reused_idempotency_key_with_another_body_is_refused(start_server, script, workdir):
    server = start_server()
    provider = script([{"text": "a"}, {"text": "b"}])
    other = workdir / "other"
    other.mkdir()
    with server.client() as c:
        body = {"cwd": str(workdir), "provider": provider}
        first = c.post("/sessions", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 201
        sid = first.json()["id"]
        same = c.post("/sessions", json=body, headers={"Idempotency-Key": "k1"})
        assert same.status_code == 201 and same.json()["id"] == sid
        for changed, field in (
            ({**body, "cwd": str(other)}, "cwd"),
            ({**body, "mode": "none"}, "mode"),
            ({**body, "command_runtime": "pty"}, "command_runtime"),
        ):
            err = _error(
                c.post("/sessions", json=changed, headers={"Idempotency-Key": "k1"}),
                422,
                "idempotency_key_reused",
            )
            assert err["key"] == "k1" and err["fields"] == [field] and "k1" in err["message"]
        assert len(c.get("/sessions").json()["sessions"]) == 1
        wait_state(c, sid, "idle")

        send = f"/sessions/{sid}/agent/send"
        ok = c.post(send, json={"message": "hello"}, headers={"Idempotency-Key": "m1"})
        assert ok.status_code == 202
        wait_state(c, sid, "idle")
        again = c.post(send, json={"message": "hello"}, headers={"Idempotency-Key": "m1"})
        assert again.status_code == 202 and again.json()["duplicate"] is True
        assert again.json()["run_id"] == ok.json()["run_id"]
        err = _error(
            c.post(send, json={"message": "other"}, headers={"Idempotency-Key": "m1"}),
            422,
            "idempotency_key_reused",
        )
        assert err["fields"] == ["message"]
        err = _error(
            c.post(
                send,
                json={"message": "hello", "mode": "follow_up"},
                headers={"Idempotency-Key": "m1"},
            ),
            422,
            "idempotency_key_reused",
        )
        assert err["fields"] == ["mode"]
        entries = c.get(f"/sessions/{sid}/agent/messages").json()["entries"]
        assert [e["message"]["role"] for e in entries] == ["user", "assistant"]


def test_lane_names_are_validated(start_server, script, workdir):
    server = start_server()
    with server.client() as c:
        sid = c.post(
            "/sessions", json={"cwd": str(workdir), "provider": script([{"text": "x"}])}
        ).json()["id"]
        wait_state(c, sid, "idle")
        for lane in ("../x", "\u0000", "<img>", "", "a/b", "x" * 129, " main"):
            _error(
                c.post(f"/sessions/{sid}/agent/send", json={"message": "m", "lane": lane}),
                400,
                "invalid_request",
            )
            _error(
                c.post(f"/sessions/{sid}/agent/abort", json={"lane": lane}), 400, "invalid_request"
            )
            _error(
                c.get(f"/sessions/{sid}/agent/messages", params={"lane": lane}),
                400,
                "invalid_request",
            )
        ok = c.post(f"/sessions/{sid}/agent/send", json={"message": "m", "lane": "side-1.b_c"})
        assert ok.status_code == 202, ok.text


def test_held_elsewhere_is_session_live_and_decisions_are_checked(
    start_server, script, workdir, tmp_path
):
    provider = script([{"text": "x"}])
    store = f"sqlite:{tmp_path / 'host.db'}"
    first = start_server(store)
    with first.client() as c:
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        wait_state(c, sid, "idle")
        second = start_server(store)
        with second.client() as c2:
            for resp in (
                c2.post(f"/sessions/{sid}/agent/send", json={"message": "hi"}),
                c2.post(f"/sessions/{sid}/agent/abort", json={}),
                c2.get(f"/sessions/{sid}/agent/events"),
            ):
                err = _error(resp, 409, "session_live")
                assert "another process" in err["message"]
            # a session that exists nowhere keeps its documented code
            missing = "01a22ef2-0000-7000-8000-000000000000"
            _error(
                c2.post(f"/sessions/{missing}/agent/send", json={"message": "hi"}),
                409,
                "session_not_live",
            )
        # deciding on a session live here: session_live, without "resuming" advice
        err = _error(
            c.post(f"/sessions/{sid}/agent/decide", json={"tool_call_id": "t", "decision": "fail"}),
            409,
            "session_live",
        )
        assert "resuming" not in err["message"] and "suspended" in err["message"]
        for empty in ("result:", "result:  "):
            err = _error(
                c.post(
                    f"/sessions/{sid}/agent/decide", json={"tool_call_id": "t", "decision": empty}
                ),
                400,
                "invalid_request",
            )
            assert "non-empty" in err["message"]


def _open_stream(url: str, path: str) -> tuple[socket.socket, bytes]:
    """Open a raw event-stream request; the socket and the response's status line."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        head += chunk
    return sock, head.split(b"\r\n", 1)[0]


def test_event_streams_are_capped_per_server(start_server, script, workdir):
    server = start_server()
    with server.client() as c:
        sid = c.post(
            "/sessions", json={"cwd": str(workdir), "provider": script([{"text": "x"}])}
        ).json()["id"]
        wait_state(c, sid, "idle")
        path = f"/sessions/{sid}/agent/events"
        socks = []
        try:
            for _ in range(MAX_EVENT_STREAMS):
                sock, status = _open_stream(server.url, path)
                socks.append(sock)
                assert b" 200 " in status, status
            err = _error(c.get(path), 503, "too_many_streams")
            assert err["limit"] == MAX_EVENT_STREAMS
            assert c.get("/sessions").status_code == 200  # everything else still answers
            socks.pop().close()

            def reopened() -> socket.socket | None:
                sock, status = _open_stream(server.url, path)
                if b" 200 " in status:
                    return sock
                sock.close()
                return None

            socks.append(poll(reopened, "a slot to be given back"))
        finally:
            for sock in socks:
                sock.close()
