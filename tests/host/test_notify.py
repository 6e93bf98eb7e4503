"""Notices of a real ``serve`` (``design/notify.md``, issue 24): a local receiver (a real HTTP
server in a thread), a SIGKILL mid-tool, a host killed between the decision becoming due and
the notice being acknowledged, a receiver down for the first tries, the decision timeout.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from http_api.util import Server, poll, run_records, wait_state

from durable_harness.host.notify import EVENT_ID_HEADER, SIGNATURE_HEADER, verify
from durable_harness.host.read_model import parse_ts

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

SECRET = "s3cret-for-tests"
COMMAND = "echo started > started; while [ ! -e gate ]; do sleep 0.05; done"


class Receiver:
    """A webhook receiver on a free loopback port: answers ``503`` while ``failing`` is
    above 0 (counting down) or ``down`` is set, else ``200``; keeps every request."""

    def __init__(self) -> None:
        self.failing = 0
        self.down = False
        self.tried: list[dict[str, Any]] = []  # every request, answered or not
        self.accepted: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                item = {"headers": dict(self.headers), "body": body, "path": self.path}
                with outer.lock:
                    outer.tried.append(item)
                    ok = not outer.down and outer.failing <= 0
                    if not ok and outer.failing > 0:
                        outer.failing -= 1
                    if ok:
                        outer.accepted.append(item)
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def notices(self, kind: str | None = None, *, tried: bool = False) -> list[dict[str, Any]]:
        """The bodies accepted (or, with ``tried``, every one received) of ``kind``."""
        with self.lock:
            items = list(self.tried if tried else self.accepted)
        out = [orjson.loads(i["body"]) | {"_headers": i["headers"]} for i in items]
        return [n for n in out if kind is None or n.get("kind") == kind]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: str) -> Server:
        server = Server(f"jsonl:{tmp_path / 'store'}", *args, home=tmp_path / "home")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    for server in servers:
        log = server.stderr()
        assert "Traceback" not in log and "internal error" not in log, log[-4000:]


def _provider(tmp_path: Path) -> str:
    path = tmp_path / "script.json"
    call = {"name": "bash", "arguments": {"command": COMMAND}}
    turns = [{"text": "Long job.", "tool_calls": [call]}, {"text": "Done."}]
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def _crash_mid_tool(serve: Callable[..., Server], tmp_path: Path, *args: str) -> str:
    """A first ``serve`` runs a gated bash call and is SIGKILLed mid-tool; the session id."""
    work = tmp_path / "work"
    work.mkdir()
    first = serve(*args)
    with first.client() as c:
        body = {"cwd": str(work), "provider": _provider(tmp_path)}
        sid: str = c.post("/sessions", json=body).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "go"}).status_code == 202
        poll(lambda: (work / "started").exists() or None, "the command to start")
    first.proc.kill()
    first.proc.wait(timeout=30)
    return sid


def _signed(notice: dict[str, Any], raw: bytes) -> bool:
    headers = {k.lower(): v for k, v in notice["_headers"].items()}
    assert headers[EVENT_ID_HEADER.lower()] == notice["event_id"]
    return verify(SECRET, headers[SIGNATURE_HEADER.lower()], raw)


def _raw(receiver: Receiver, event_id: str) -> bytes:
    with receiver.lock:
        return next(
            i["body"] for i in receiver.accepted if orjson.loads(i["body"])["event_id"] == event_id
        )


def test_notice_survives_a_sigkill_mid_tool_a_host_crash_before_sending_and_a_down_receiver(
    serve: Callable[..., Server], receiver: Receiver, tmp_path: Path
) -> None:
    args = ("--notify", receiver.url, "--notify-secret", SECRET)
    sid = _crash_mid_tool(serve, tmp_path, *args)
    assert receiver.notices() == []  # nothing was due before the crash

    # the restarted host owes "decision due"; the receiver refuses, and the host dies before
    # any try is acknowledged: no receipt
    receiver.down = True
    second = serve(*args)
    tried = poll(lambda: receiver.notices("decision_due", tried=True) or None, "a first try")
    second.proc.kill()
    second.proc.wait(timeout=30)

    # the next host derives it again from the store: same event id; the receiver still
    # refuses its first two tries (503), then acknowledges
    receiver.failing, receiver.down = 2, False
    third = serve(*args)
    (due,) = poll(lambda: receiver.notices("decision_due") or None, "the decision-due notice")
    assert due["event_id"] == tried[0]["event_id"]
    assert _signed(due, _raw(receiver, due["event_id"]))
    assert due["session_id"] == sid and due["tool"] == "bash" and due["lane"] == "main"
    assert due["doubt"]["code"] == "intent_unsettled"
    assert "no result was recorded" in due["doubt"]["text"]  # recovery/explain.py, as the console
    canonical = orjson.dumps({"command": COMMAND}, option=orjson.OPT_SORT_KEYS)
    assert due["arguments_digest"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert due["link"] == f"{third.url}/console/sessions/{sid}"
    with third.client() as c:
        (intent,) = run_records(c, sid, "tool_started")
        assert (due["call_id"], due["run_id"]) == (intent["toolCallId"], intent["runId"])
        wait_state(c, sid, "suspended")
        answer = c.post(
            f"/sessions/{sid}/agent/decide",
            json={"tool_call_id": due["call_id"], "decision": "fail"},
        )
        assert answer.status_code == 200, answer.text
        wait_state(c, sid, "idle")
    (decided,) = poll(lambda: receiver.notices("decided") or None, "the decided notice")
    assert decided["decision"]["decision"] == "fail"
    assert decided["decision"]["author"] == "api"
    assert decided["call_id"] == due["call_id"]
    assert _signed(decided, _raw(receiver, decided["event_id"]))
    (ended,) = poll(lambda: receiver.notices("run_recovered") or None, "the run-recovered one")
    assert ended["run_id"] == due["run_id"] and ended["outcome"] == "completed"
    ids = [n["event_id"] for n in receiver.notices()]
    assert len(ids) == len(set(ids)) == 3, ids  # acknowledged once per event id


def test_decision_timeout_fails_the_call_as_policy(
    serve: Callable[..., Server], receiver: Receiver, tmp_path: Path
) -> None:
    sid = _crash_mid_tool(serve, tmp_path)
    server = serve(
        "--notify",
        f"slack+{receiver.url}",
        "--notify",
        receiver.url,
        "--decision-timeout",
        "4s",  # counted from the intent: falls due after the host has swept it once
        "--on-timeout",
        "fail",
    )
    with server.client() as c:
        (intent,) = run_records(c, sid, "tool_started")
        wait_state(c, sid, "idle")  # decided by the policy, resumed, the run finished
        (decision,) = run_records(c, sid, "decision")
    assert (decision["decision"], decision["author"]) == ("fail", "policy:timeout")
    waited = parse_ts(decision["timestamp"]) - parse_ts(intent["timestamp"])  # type: ignore[operator]
    assert waited >= 4.0, waited
    (decided,) = poll(lambda: receiver.notices("decided") or None, "the decided notice")
    assert decided["decision"]["author"] == "policy:timeout"
    # the Slack receiver got the same event as incoming-webhook text
    texts = poll(
        lambda: (
            [n for n in receiver.notices() if "text" in n and "policy:timeout" in n["text"]] or None
        ),
        "the Slack body",
    )
    assert texts[0]["_headers"][EVENT_ID_HEADER] == decided["event_id"]
    assert SIGNATURE_HEADER not in decided["_headers"]  # no secret: unsigned


def test_a_session_entering_error_is_noticed(
    serve: Callable[..., Server], receiver: Receiver, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "answer.json"
    script.write_text(json.dumps({"turns": [{"text": "Hello."}]}))
    args = ("--notify", receiver.url, "--notify-secret", SECRET)
    first = serve(*args)
    with first.client() as c:
        body = {"cwd": str(work), "provider": f"scripted:{script}"}
        sid: str = c.post("/sessions", json=body).json()["id"]
        assert c.post(f"/sessions/{sid}/agent/send", json={"message": "hi"}).status_code == 202
        poll(lambda: run_records(c, sid, "run_finished") or None, "the run to finish")
    first.proc.kill()
    first.proc.wait(timeout=30)
    script.unlink()  # the restart's resume cannot build the provider: the session fails
    second = serve(*args)
    (failed,) = poll(lambda: receiver.notices("session_error") or None, "the error notice")
    assert failed["session_id"] == sid and "answer.json" in failed["error"]
    assert _signed(failed, _raw(receiver, failed["event_id"]))
    with second.client() as c:
        (rec,) = [r for r in run_records(c, sid, "session_lifecycle") if r["state"] == "error"]
    assert failed["generation"] == rec["generation"]
    assert receiver.notices("run_recovered") == []  # the run ended before the crash
