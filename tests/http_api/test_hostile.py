"""Hostile input to the HTTP API (a tester's findings): each a clear 4xx with a stable code
and the JSON error body, never a 500 (``design/http.md``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from durable_harness.http.streams import MAX_EVENT_STREAMS

from .util import open_raw_stream, poll, snapshot, wait_state

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
                sock, status = open_raw_stream(server.url, path)
                socks.append(sock)
                assert b" 200 " in status, status
            err = _error(c.get(path), 503, "too_many_streams")
            assert err["limit"] == MAX_EVENT_STREAMS
            assert c.get("/sessions").status_code == 200  # everything else still answers
            socks.pop().close()

            def reopened() -> socket.socket | None:
                sock, status = open_raw_stream(server.url, path)
                if b" 200 " in status:
                    return sock
                sock.close()
                return None

            socks.append(poll(reopened, "a slot to be given back"))
        finally:
            for sock in socks:
                sock.close()


# -- issue 20: HTTP as the RFCs say ---------------------------------------------------------


@pytest.mark.slow
def test_a_405_names_every_method_of_the_path_in_allow(start_server):
    server = start_server()
    with server.client() as c:
        for method, path, allowed in (
            ("PUT", "/sessions", {"GET", "POST"}),
            ("PATCH", "/sessions/abc", {"GET", "DELETE"}),
            ("GET", "/sessions/abc/close", {"POST"}),
            ("DELETE", "/sessions/abc/agent/send", {"POST"}),
            ("POST", "/metrics", {"GET"}),
            ("HEAD", "/sessions", {"GET", "POST"}),  # refused, so not in Allow
        ):
            resp = c.request(method, path, json={} if method != "HEAD" else None)
            assert resp.status_code == 405, resp
            if method != "HEAD":
                _error(resp, 405, "method_not_allowed")
            assert set(resp.headers["allow"].split(", ")) == allowed, resp.headers


@pytest.mark.slow
def test_the_bearer_scheme_is_case_insensitive(start_server):
    server = start_server(None, token="s3cret")
    with server.client(token="") as c:
        for header in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret", "bEaReR s3cret"):
            assert c.get("/sessions", headers={"Authorization": header}).status_code == 200
            page = c.get("/", headers={"Authorization": header})  # the console: the same rule
            assert page.status_code == 200, header
        for header in ("Bearer s3cre", "Basic s3cret", "Bearers3cret", "s3cret", "Bearer"):
            _error(c.get("/sessions", headers={"Authorization": header}), 401, "unauthorized")


@pytest.mark.slow
def test_the_openapi_document_lists_every_status_the_routes_answer(start_server, script, workdir):
    server = start_server(None, token="t0ken")
    answers: list[tuple[str, str, httpx.Response]] = []
    with server.client() as c:
        doc = c.get("/openapi.json").json()
        bad = "bad id!"
        missing = "01a22ef2-0000-7000-8000-000000000000"

        def call(method: str, template: str, sid: str, **kw) -> httpx.Response:
            resp = c.request(method, template.replace("{id}", sid), **kw)
            answers.append((method, template, resp))
            return resp

        body = {"cwd": str(workdir), "provider": script([{"text": "a"}, {"text": "b"}])}
        sid = call("POST", "/sessions", "", json=body, headers={"Idempotency-Key": "k"}).json()[
            "id"
        ]
        wait_state(c, sid, "idle")
        call(
            "POST", "/sessions", "", json={**body, "mode": "none"}, headers={"Idempotency-Key": "k"}
        )
        call("POST", "/sessions", "", json={"cwd": "relative"})
        send = "/sessions/{id}/agent/send"
        call("POST", send, sid, json={"message": "hi"}, headers={"Idempotency-Key": "m"})
        wait_state(c, sid, "idle")
        call("POST", send, sid, json={"message": "ho"}, headers={"Idempotency-Key": "m"})
        call("POST", send, sid, json={"message": "x" * (8 << 20)})
        call("POST", send, missing, json={"message": "hi"})
        for method, template, ok in (
            ("GET", "/sessions", None),
            ("GET", "/sessions/{id}", {}),
            ("GET", "/sessions/{id}/agent/status", {}),
            ("GET", "/sessions/{id}/agent/messages", {}),
            ("GET", "/sessions/{id}/agent/log", {}),
            ("GET", "/metrics", None),
            ("POST", "/sessions/{id}/agent/abort", {}),
            ("POST", "/sessions/{id}/agent/decide", {"tool_call_id": "t", "decision": "fail"}),
            ("POST", "/sessions/{id}/resume", {}),
            ("DELETE", "/sessions/{id}", {}),
            ("POST", "/sessions/{id}/close", {}),
            ("POST", "/sessions/{id}/resume", {}),
            ("POST", "/sessions/{id}/close", {}),
            ("DELETE", "/sessions/{id}", {}),
        ):
            body_kw = {} if method == "GET" else {"json": ok}
            call(method, template, sid, **body_kw)
            if ok is not None:
                call(method, template, missing, **body_kw)
                call(method, template, bad, **body_kw)
            call(method, template, sid, headers={"Authorization": "Bearer wrong"}, **body_kw)
            if method != "GET":
                call(method, template, sid, content=b"{}")  # no JSON type
                call(method, template, sid, json=ok, headers={"Origin": "http://evil.example"})
    seen: set[tuple[str, str, int]] = set()
    for method, template, resp in answers:
        listed = doc["paths"][template or "/sessions"][method.lower()]["responses"]
        assert str(resp.status_code) in listed, (method, template, resp.status_code, resp.text)
        seen.add((method, template, resp.status_code))
    statuses = {status for _m, _t, status in seen}
    assert {200, 201, 202, 204, 400, 401, 403, 404, 409, 413, 415, 422} <= statuses, statuses


@pytest.mark.slow
def test_an_empty_idempotency_key_is_refused_and_nothing_is_recorded(
    start_server, script, workdir, tmp_path
):
    server = start_server()
    provider = script([{"text": "x"}])
    with server.client() as c:
        before = snapshot(tmp_path / "store")
        err = _error(
            c.post(
                "/sessions",
                json={"cwd": str(workdir), "provider": provider},
                headers={"Idempotency-Key": ""},
            ),
            400,
            "invalid_request",
        )
        assert "Idempotency-Key" in err["message"]
        assert snapshot(tmp_path / "store") == before
        sid = c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
        wait_state(c, sid, "idle")
        before = snapshot(tmp_path / "store")
        _error(
            c.post(
                f"/sessions/{sid}/agent/send",
                json={"message": "hi"},
                headers={"Idempotency-Key": ""},
            ),
            400,
            "invalid_request",
        )
        assert snapshot(tmp_path / "store") == before
        assert c.get(f"/sessions/{sid}/agent/messages").json()["entries"] == []


@pytest.mark.slow
def test_a_message_with_a_lone_surrogate_is_refused_so_a_retry_is_never_a_different_message(
    start_server, script, workdir, tmp_path
):
    server = start_server()
    with server.client() as c:
        sid = c.post(
            "/sessions", json={"cwd": str(workdir), "provider": script([{"text": "x"}])}
        ).json()["id"]
        wait_state(c, sid, "idle")
        before = snapshot(tmp_path / "store")
        body = '{"message": "caf\\ud800e"}'
        for _attempt in range(2):  # the identical retry: the same answer, never 422
            err = _error(
                _raw_json(c, f"/sessions/{sid}/agent/send", body, **{"Idempotency-Key": "s1"}),
                400,
                "invalid_request",
            )
            assert "lone surrogate" in err["message"] and "\\ud800" in err["message"]
        assert snapshot(tmp_path / "store") == before
        fixed = c.post(
            f"/sessions/{sid}/agent/send",
            json={"message": "caf\u00e9"},
            headers={"Idempotency-Key": "s1"},
        )
        assert fixed.status_code == 202, fixed.text  # the key was never used
        wait_state(c, sid, "idle")
        again = c.post(
            f"/sessions/{sid}/agent/send",
            json={"message": "caf\u00e9"},
            headers={"Idempotency-Key": "s1"},
        )
        assert again.status_code == 202 and again.json()["duplicate"] is True


@pytest.mark.slow
def test_an_ambiguous_prefix_names_no_other_session_and_no_console_page_is_a_500(
    start_server, script, workdir
):
    server = start_server()
    provider = script([{"text": "x"}])
    with server.client() as c:
        ids = [
            c.post("/sessions", json={"cwd": str(workdir), "provider": provider}).json()["id"]
            for _ in range(2)
        ]
        common = next(i for i in range(len(ids[0])) if ids[0][i] != ids[1][i])
        assert common >= 2, ids  # UUIDv7 ids made together share their time prefix
        prefix = ids[0][:common]
        for resp in (
            c.get(f"/sessions/{prefix}"),
            c.get(f"/sessions/{prefix}/agent/status"),
            c.get(f"/sessions/{prefix}/agent/log"),
            c.post(f"/sessions/{prefix}/close", json={}),
        ):
            err = _error(resp, 400, "ambiguous_session_prefix")
            assert err["count"] == 2 and "give more" in err["message"]
            assert not any(sid in resp.text for sid in ids), resp.text
        page = c.get(f"/console/sessions/{prefix}")
        assert page.status_code == 400, page.text[:500]
        assert "ambiguous_session_prefix" in page.text
        assert not any(sid in page.text for sid in ids)
        assert c.get(f"/console/sessions/{prefix}/live").status_code == 400
        assert c.get("/console/sessions/01a22ef2-0000-7000-8000-0000000000ff").status_code == 404


# -- issue 20: nothing from elsewhere runs on the API's origin ---------------------------------


@pytest.mark.slow
def test_no_cdn_documents_and_every_html_answer_has_a_csp(start_server):
    server = start_server()
    with server.client() as c:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            _error(c.get(path), 404, "not_found")
        doc = c.get("/openapi.json")
        assert doc.status_code == 200 and "cdn" not in doc.text.lower()
        for path in ("/", "/console/login", "/console/sessions/nope-1"):
            page = c.get(path)
            assert page.headers["content-type"].startswith("text/html"), path
            csp = page.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp, (path, csp)
            assert "http" not in csp  # no origin but the server's own
            assert "<script" not in page.text or 'src="/console/static/' in page.text


# -- issue 20: where agents may run ----------------------------------------------------------


@pytest.mark.slow
def test_root_confines_the_working_directories_of_new_sessions(start_server, script, tmp_path):
    root = tmp_path / "projects"
    inside = root / "a" / "b"
    inside.mkdir(parents=True)
    other = tmp_path / "projects-evil"  # a sibling sharing the root's name as a prefix
    other.mkdir()
    second = tmp_path / "second"
    second.mkdir()
    os.symlink(other, root / "escape")
    provider = script([{"text": "x"}])
    server = start_server(None, "--root", str(root), "--root", str(second))
    with server.client() as c:
        before = snapshot(tmp_path / "store")
        for cwd in (other, root / "escape", tmp_path, Path("/")):
            err = _error(
                c.post("/sessions", json={"cwd": str(cwd), "provider": provider}),
                403,
                "cwd_not_allowed",
            )
            assert str(root) in err["message"] and err["roots"] == [str(root), str(second)]
        assert snapshot(tmp_path / "store") == before
        for cwd in (root, inside, root / "a" / ".." / "a", second):
            made = c.post("/sessions", json={"cwd": str(cwd), "provider": provider})
            assert made.status_code == 201, made.text
    assert f"sessions may run only under {root}, {second}" in server.stderr()
    anywhere = start_server(f"jsonl:{tmp_path / 'store2'}")
    with anywhere.client() as c:
        assert (
            c.post("/sessions", json={"cwd": str(other), "provider": provider}).status_code == 201
        )
    assert "sessions may be created in any directory" in anywhere.stderr()


@pytest.mark.slow
def test_a_root_that_is_not_a_directory_stops_serve_before_the_store_is_made(tmp_path):
    missing = tmp_path / "no-such-dir"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "durable_harness", "serve", "--port", "0"),
            *("--root", str(missing), "--store", f"jsonl:{tmp_path / 'store'}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DURABLE_HARNESS_HOME": str(tmp_path / "home")},
    )
    assert proc.returncode == 2, proc.stderr
    assert "error[invalid_request]" in proc.stderr and str(missing) in proc.stderr
    assert not (tmp_path / "store").exists()
