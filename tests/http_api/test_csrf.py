"""No state-changing request succeeds from another origin (issue 20, "CSRF";
``design/http.md``, "Cross-site requests"): every POST/DELETE route of a real tokenless
``durable-harness serve`` refuses a body that is not JSON (415) and a foreign ``Origin`` or a
``Sec-Fetch-Site: cross-site``/``same-site`` (403), before anything happens: the store's files
are byte-for-byte unchanged. The same requests from the server's own origin work."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from .util import snapshot, wait_state

pytestmark = [pytest.mark.timeout(120)]

UNKNOWN = "01a22ef2-0000-7000-8000-000000000000"


def _routes(sid: str) -> list[tuple[str, str, dict]]:
    """Every state-changing route of the API, each with a body it would accept."""
    return [
        ("POST", "/sessions", {"cwd": "/tmp"}),
        ("POST", f"/sessions/{sid}/resume", {}),
        ("POST", f"/sessions/{sid}/close", {}),
        ("DELETE", f"/sessions/{sid}", {}),
        ("POST", f"/sessions/{sid}/agent/send", {"message": "hi"}),
        ("POST", f"/sessions/{sid}/agent/abort", {}),
        ("POST", f"/sessions/{sid}/agent/decide", {"tool_call_id": "t", "decision": "fail"}),
    ]


def _error(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, (resp.request.method, resp.request.url, resp.text)
    body = resp.json()
    assert body["code"] == code, body
    return body


def _idle_session(client: httpx.Client, provider: str, cwd: Path) -> str:
    sid: str = client.post("/sessions", json={"cwd": str(cwd), "provider": provider}).json()["id"]
    wait_state(client, sid, "idle")
    return sid


@pytest.mark.slow
def test_every_post_and_delete_needs_json_and_changes_nothing_without(
    start_server, script, workdir, tmp_path
):
    server = start_server()
    with server.client() as c:
        sid = _idle_session(c, script([{"text": "x"}]), workdir)
        before = snapshot(tmp_path / "store")
        routes = _routes(sid) + [(m, p.replace(sid, UNKNOWN), b) for m, p, b in _routes(sid)]
        for method, path, body in routes:
            text = httpx.Request("POST", "/", json=body).content
            for headers, content in (
                ({}, b""),  # no body, no type: a bodiless fetch or beacon
                ({"Content-Type": "text/plain"}, text),  # a text/plain form or beacon
                ({"Content-Type": "application/x-www-form-urlencoded"}, b"a=b"),
                ({"Content-Type": "multipart/form-data; boundary=x"}, b"--x--"),
                ({"Content-Type": "application/jsonx"}, text),
            ):
                resp = c.request(method, path, content=content, headers=headers)
                err = _error(resp, 415, "unsupported_media_type")
                assert resp.headers["accept"] == "application/json"
                assert "application/json" in err["message"]
        assert snapshot(tmp_path / "store") == before
        assert c.get(f"/sessions/{sid}").json()["state"] == "idle"
        # JSON with a charset parameter, the server's own origin: accepted
        own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
        sent = c.post(
            f"/sessions/{sid}/agent/send",
            content=b'{"message": "hello"}',
            headers={"Content-Type": "Application/JSON; charset=utf-8", **own},
        )
        assert sent.status_code == 202, sent.text
        wait_state(c, sid, "idle")
        closed = c.post(f"/sessions/{sid}/close", json={}, headers=own)
        assert closed.status_code == 200 and closed.json()["state"] == "closed"
        assert c.request("DELETE", f"/sessions/{sid}", json={}, headers=own).status_code == 204


@pytest.mark.slow
def test_a_foreign_origin_or_cross_site_fetch_is_refused_before_anything_happens(
    start_server, script, workdir, tmp_path
):
    server = start_server()
    port = server.url.rsplit(":", 1)[1]
    with server.client() as c:
        sid = _idle_session(c, script([{"text": "x"}]), workdir)
        before = snapshot(tmp_path / "store")
        foreign = [
            {"Origin": "http://evil.example"},
            {"Origin": f"http://127.0.0.1:{int(port) + 1}"},  # another port: another origin
            {"Origin": f"https://127.0.0.1:{port}"},  # another scheme
            {"Origin": f"http://localhost:{port}"},  # another name for the same socket
            {"Origin": "null"},  # a sandboxed frame, a file: page
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": server.url, "Sec-Fetch-Site": "cross-site"},
        ]
        for method, path, body in _routes(sid):
            for headers in foreign:
                err = _error(
                    c.request(method, path, json=body, headers=headers), 403, "cross_origin"
                )
                assert "may not change anything" in err["message"]
        assert snapshot(tmp_path / "store") == before
        status = c.get(f"/sessions/{sid}/agent/status").json()
        assert status["state"] == "idle"
        # GET never changes state, and reads are not refused for their origin
        assert c.get("/sessions", headers={"Origin": "http://evil.example"}).status_code == 200
        # the default port is the same origin: Host 127.0.0.1:80 is http://127.0.0.1
        same = {"Host": "127.0.0.1:80", "Origin": "HTTP://127.0.0.1"}
        assert c.post(f"/sessions/{sid}/close", json={}, headers=same).status_code == 200


@pytest.mark.slow
def test_repeated_guard_headers_and_an_empty_origin_are_refused(start_server, script, workdir):
    """A second ``Origin``/``Sec-Fetch-Site``/``Host``/``Content-Type`` after an accepted first
    one was let through (the guard read the first copy); an empty ``Origin`` too."""
    server = start_server()
    host = server.url.split("://", 1)[1]
    json_type = ("Content-Type", "application/json")
    with server.client() as c:
        sid = _idle_session(c, script([{"text": "x"}]), workdir)
        cases = [
            ([json_type, ("Content-Type", "text/plain")], 415, "unsupported_media_type"),
            ([json_type, ("Origin", server.url), ("Origin", "http://evil.com")], 403, None),
            (
                [json_type, ("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Site", "cross-site")],
                403,
                None,
            ),
            ([json_type, ("Origin", "")], 403, None),
        ]
        for headers, status, code in cases:
            resp = c.post(f"/sessions/{sid}/close", content=b"{}", headers=headers)
            _error(resp, status, code or "cross_origin")
        # two Host headers (no client library sends them: a raw request)
        hostname, port = host.rsplit(":", 1)
        with socket.create_connection((hostname, int(port)), timeout=10) as raw:
            raw.sendall(
                f"POST /sessions/{sid}/close HTTP/1.1\r\nHost: {host}\r\nHost: evil.com\r\n"
                "Content-Type: application/json\r\nContent-Length: 2\r\n"
                "Connection: close\r\n\r\n{}".encode()
            )
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        assert answer.split(b" ", 2)[1] in (b"400", b"403"), answer[:200]
        assert c.get(f"/sessions/{sid}/agent/status").json()["state"] == "idle"
        ok = c.post(f"/sessions/{sid}/close", content=b"{}", headers=[json_type])
        assert ok.status_code == 200, ok.text


@pytest.mark.slow
def test_a_control_port_takes_the_same_rule(start_server, script, workdir):
    server = start_server(None, "--control-ports")
    with server.client() as c:
        sid = _idle_session(c, script([{"text": "x"}]), workdir)
        port = c.get(f"/sessions/{sid}/agent/status").json()["port"]
        assert port
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as ctl:
            _error(ctl.post("/agent/abort"), 415, "unsupported_media_type")
            _error(
                ctl.post(
                    "/agent/send", json={"message": "hi"}, headers={"Origin": "http://x.example"}
                ),
                403,
                "cross_origin",
            )
            assert ctl.post("/agent/send", json={"message": "hi"}).status_code == 202
