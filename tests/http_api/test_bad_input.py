"""Bad input through the HTTP API: each a clear 4xx with its ``code``, and nothing changed on
disk (issue 12, "Must show"; ``design/http.md``)."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from .util import snapshot, wait_state

UNKNOWN = "01a22ef2-0000-7000-8000-000000000000"


def _error(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert body["code"] == code, body
    assert body["message"]
    return body


@pytest.mark.slow
def test_bad_input_is_a_clear_4xx_and_changes_nothing(start_server, script, workdir, tmp_path):
    server = start_server()
    store = tmp_path / "store"
    with server.client() as c:
        resp = c.post("/sessions", json={"cwd": str(workdir), "provider": script([{"text": "x"}])})
        sid = resp.json()["id"]
        wait_state(c, sid, "idle")
        before = snapshot(store)
        assert before

        send = f"/sessions/{sid}/agent/send"
        _error(c.post(send, json={"message": ""}), 400, "invalid_request")
        _error(c.post(send, json={"message": " \n\t "}), 400, "invalid_request")
        _error(c.post(send, json={"message": "x", "mode": "shout"}), 400, "invalid_request")
        _error(c.post(send, json={}), 400, "invalid_request")
        _error(c.post(send, json={"message": "x", "colour": "red"}), 400, "invalid_request")
        _error(
            c.post(send, content=b"{not json", headers={"content-type": "application/json"}),
            400,
            "invalid_request",
        )
        big = _error(
            c.post(send, json={"message": "a" * ((1 << 20) + 1)}), 413, "message_too_large"
        )
        assert big["limit"] == 1 << 20
        # a body far over any message's encoding is refused before it is read
        huge = _error(
            c.post(send, content=b"x" * (8 << 20), headers={"content-type": "application/json"}),
            413,
            "message_too_large",
        )
        assert huge["limit"] < 8 << 20

        def chunks():  # no Content-Length: refused while streaming, before any parsing
            for _ in range(8):
                yield b"x" * (1 << 20)

        chunked = c.post(send, content=chunks(), headers={"content-type": "application/json"})
        assert "content-length" not in chunked.request.headers
        _error(chunked, 413, "message_too_large")
        # the limit counts bytes of UTF-8, not characters (3 bytes a character here)
        at_limit = "€" * ((1 << 20) // 3)
        assert c.post(send, json={"message": at_limit + "é" * 2}).status_code == 413
        _error(c.post("/sessions", json={"cwd": "relative/dir"}), 400, "invalid_request")
        _error(c.post("/sessions", json={"cwd": str(tmp_path / "missing")}), 400, "invalid_request")
        _error(
            c.post("/sessions", json={"cwd": str(workdir), "provider": "nope:x"}),
            400,
            "format_error",
        )
        _error(
            c.post("/sessions", json={"cwd": str(workdir)}), 400, "invalid_request"
        )  # no provider
        _error(
            c.post("/sessions", json={"cwd": str(workdir), "provider": "openai:gpt"}),
            400,
            "missing_credential",
        )
        _error(
            c.post("/sessions", json={"cwd": str(workdir), "mode": "fast"}), 400, "invalid_request"
        )

        for bad in (
            "..%2F..",
            "..%2F..%2Fetc%2Fpasswd",
            "%2E%2E",
            "x" * 300,
            "%C3%A9t%C3%A9",
            "a%00b",
            "-lead",
        ):
            for method, path in [
                ("GET", f"/sessions/{bad}"),
                ("GET", f"/sessions/{bad}/agent/status"),
                ("POST", f"/sessions/{bad}/resume"),
                ("POST", f"/sessions/{bad}/close"),
                ("DELETE", f"/sessions/{bad}"),
            ]:
                resp = c.request(method, path, json=None if method == "GET" else {})
                assert resp.status_code in (400, 404), (method, path, resp.text)
                assert resp.json()["code"] in ("invalid_request", "not_found"), resp.text
        _error(c.get("/sessions/..%2F.."), 404, "not_found")
        _error(c.get("/sessions/%2E%2E"), 400, "invalid_request")

        for method, path, body in [
            ("GET", f"/sessions/{UNKNOWN}", None),
            ("GET", f"/sessions/{UNKNOWN}/agent/status", None),
            ("GET", f"/sessions/{UNKNOWN}/agent/messages", None),
            ("GET", f"/sessions/{UNKNOWN}/agent/log", None),
            ("POST", f"/sessions/{UNKNOWN}/resume", {}),
            ("POST", f"/sessions/{UNKNOWN}/close", {}),
            ("DELETE", f"/sessions/{UNKNOWN}", {}),
            (
                "POST",
                f"/sessions/{UNKNOWN}/agent/decide",
                {"tool_call_id": "c", "decision": "fail"},
            ),
        ]:
            _error(c.request(method, path, json=body), 404, "session_not_found")
        for method, path, body in [
            ("POST", f"/sessions/{UNKNOWN}/agent/send", {"message": "hi"}),
            ("POST", f"/sessions/{UNKNOWN}/agent/abort", {}),
            ("GET", f"/sessions/{UNKNOWN}/agent/events", None),
        ]:
            _error(c.request(method, path, json=body), 409, "session_not_live")
        bad_decision = c.post(
            f"/sessions/{sid}/agent/decide", json={"tool_call_id": "c", "decision": "maybe"}
        )
        _error(bad_decision, 400, "invalid_request")
        _error(c.get("/nowhere"), 404, "not_found")
        _error(c.put("/sessions"), 405, "method_not_allowed")
        _error(
            c.get(f"/sessions/{sid}/agent/messages", params={"offset": -1}), 400, "invalid_request"
        )
        _error(
            c.get(f"/sessions/{sid}/agent/log", params={"since_seq": "x"}), 400, "invalid_request"
        )
        long_key = {"Idempotency-Key": "k" * 1000}
        _error(c.post(send, json={"message": "x"}, headers=long_key), 400, "invalid_request")

        assert snapshot(store) == before
        assert [s["id"] for s in c.get("/sessions").json()["sessions"]] == [sid]


@pytest.mark.slow
def test_non_loopback_needs_a_token_and_checks_it_on_every_request(
    start_server, script, workdir, tmp_path
):
    server = start_server(None, "--host", "0.0.0.0", token="s3cret-token")
    assert server.url.startswith("http://0.0.0.0:")
    url = server.url.replace("0.0.0.0", "127.0.0.1")
    store = tmp_path / "store"
    with httpx.Client(base_url=url, timeout=30) as anon:
        for method, path in [
            ("GET", "/sessions"),
            ("POST", "/sessions"),
            ("GET", "/metrics"),
            ("GET", "/openapi.json"),
            ("GET", f"/sessions/{UNKNOWN}"),
        ]:
            resp = anon.request(method, path, json={"cwd": str(workdir)})
            body = _error(resp, 401, "unauthorized")
            assert "no bearer token" in body["message"]
            assert resp.headers["www-authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer s3cret-tokem"}
        _error(
            anon.post(
                "/sessions", json={"cwd": str(workdir), "provider": script([])}, headers=wrong
            ),
            401,
            "unauthorized",
        )
        _error(
            anon.get("/sessions", headers={"Authorization": "s3cret-token"}), 401, "unauthorized"
        )
        assert snapshot(store / "sessions") == {}
        good = {"Authorization": "Bearer s3cret-token"}
        assert anon.get("/sessions", headers=good).json()["sessions"] == []
        assert anon.get("/metrics", headers=good).status_code == 200


@pytest.mark.slow
def test_non_loopback_without_a_token_refuses_to_start(tmp_path):
    store = tmp_path / "store"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_harness",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--store",
            f"jsonl:{store}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "DURABLE_HARNESS_HOME": str(tmp_path / "home")},
    )
    assert proc.returncode == 2, proc.stderr
    assert "invalid_request" in proc.stderr and "token" in proc.stderr
    assert not store.exists()


def test_loopback_names(tmp_path):
    from durable_harness.http.server import is_loopback

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", ""))
