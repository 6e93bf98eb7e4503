"""Protocol errors: malformed JSON-RPC, unknown methods, unknown or malformed session ids,
bad parameters. Each is a JSON-RPC error with a clear message; the process lives on and no
session is touched (``design/acp.md``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp_helpers import script, start_agent, workdir

from durable_harness.storage import open_store

pytestmark = [pytest.mark.timeout(120)]


class RawAgent:
    """``durable-harness acp`` spoken to line by line."""

    def __init__(self, tmp_path: Path, provider: str) -> None:
        argv = ["acp", "--store", f"jsonl:{tmp_path / 'store'}", "--provider", provider]
        log = str(tmp_path / "agent.log")
        self.proc = start_agent(argv, env=dict(os.environ), cwd=str(tmp_path), stderr=log)
        self.next_id = 100

    def send_line(self, line: str | bytes) -> None:
        data = line if isinstance(line, bytes) else line.encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        """The next message the agent writes (the test's timeout bounds the wait)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the agent closed stdout (exit {self.proc.poll()})"
        out: dict[str, Any] = json.loads(line)
        return out

    def request(self, method: str, params: Any) -> dict[str, Any]:
        """Send a request and return its response (notifications in between are skipped)."""
        self.next_id += 1
        self.send_line(
            json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        )
        while True:
            msg = self.read()
            if msg.get("id") == self.next_id and "method" not in msg:
                return msg

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


@pytest.fixture
def raw(tmp_path: Path) -> Iterator[RawAgent]:
    agent = RawAgent(tmp_path, script(tmp_path, [{"text": "hello"}]))
    init = agent.request("initialize", {"protocolVersion": 1})
    assert init["result"]["agentCapabilities"]["loadSession"] is True
    yield agent
    if agent.proc.poll() is None:
        assert agent.close() == 0


@pytest.mark.slow
def test_malformed_lines_are_answered_and_the_agent_lives_on(raw: RawAgent) -> None:
    raw.send_line("{this is not json")
    err = raw.read()
    assert err["id"] is None
    assert err["error"]["code"] == -32700
    assert "not JSON" in err["error"]["message"]
    for line, why in [
        ("[1, 2]", "batches are not supported"),
        ('"hello"', "not a JSON object"),
        ('{"jsonrpc": "2.0"}', "no method"),
        ('{"jsonrpc": "2.0", "id": 7, "method": 42}', "method must be a string"),
        ('{"jsonrpc": "2.0", "id": {"x": 1}, "method": "initialize"}', "id must be"),
    ]:
        raw.send_line(line)
        err = raw.read()
        assert err["error"]["code"] == -32600, line
        assert why in err["error"]["message"], (line, err)
    raw.send_line(b"\xff\xfe not utf-8")
    assert raw.read()["error"]["code"] == -32700
    # still serving
    assert raw.request("initialize", {"protocolVersion": 1})["result"]["protocolVersion"] == 1


@pytest.mark.slow
def test_unknown_methods_are_method_not_found(raw: RawAgent) -> None:
    err = raw.request("session/teleport", {"sessionId": "x"})["error"]
    assert err["code"] == -32601
    assert err["data"] == {"method": "session/teleport"}
    # an unknown notification gets no answer; the next request is answered
    raw.send_line(json.dumps({"jsonrpc": "2.0", "method": "nope/never", "params": {}}))
    assert raw.request("initialize", {"protocolVersion": 1})["result"]["protocolVersion"] == 1


@pytest.mark.slow
def test_unknown_and_malformed_session_ids_are_refused(raw: RawAgent, tmp_path: Path) -> None:
    work = str(workdir(tmp_path))
    prompt = [{"type": "text", "text": "hi"}]
    missing = "01a2f0c0-0000-7000-8000-000000000000"
    for method, params in [
        ("session/prompt", {"sessionId": missing, "prompt": prompt}),
        ("session/load", {"sessionId": missing, "cwd": work, "mcpServers": []}),
    ]:
        err = raw.request(method, params)["error"]
        assert err["code"] == -32002, (method, err)
        assert missing in err["message"]
        assert err["data"]["code"] == "session_not_found"
    err = raw.request("session/prompt", {"sessionId": "../../etc", "prompt": prompt})["error"]
    assert err["code"] == -32602
    assert err["data"]["code"] == "invalid_request"
    # a cancel of an unknown session is a notification: no answer, no harm
    raw.send_line(
        json.dumps({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "x"}})
    )
    assert open_store(f"jsonl:{tmp_path / 'store'}").list_sessions() == []
    # a real session still works after all that
    sid = raw.request("session/new", {"cwd": work, "mcpServers": []})["result"]["sessionId"]
    done = raw.request("session/prompt", {"sessionId": sid, "prompt": prompt})
    assert done["result"]["stopReason"] == "end_turn"


@pytest.mark.slow
def test_bad_parameters_are_invalid_params(raw: RawAgent, tmp_path: Path) -> None:
    work = workdir(tmp_path)
    err = raw.request("session/new", {"cwd": str(work / "missing"), "mcpServers": []})["error"]
    assert err["code"] == -32602
    assert "missing" in err["message"]
    err = raw.request("session/new", {"nope": 1})["error"]
    assert err["code"] == -32602
    sid = raw.request("session/new", {"cwd": str(work), "mcpServers": []})["result"]["sessionId"]
    empty = raw.request("session/prompt", {"sessionId": sid, "prompt": []})["error"]
    assert empty["code"] == -32602
    assert empty["data"]["code"] == "invalid_request"
    image = [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]
    err = raw.request("session/prompt", {"sessionId": sid, "prompt": image})["error"]
    assert err["code"] == -32602
    assert "image" in err["message"]
    # the session is intact: a prompt runs
    prompt = [{"type": "text", "text": "hi"}]
    done = raw.request("session/prompt", {"sessionId": sid, "prompt": prompt})
    assert done["result"]["stopReason"] == "end_turn"


@pytest.mark.slow
def test_deeply_nested_and_over_long_lines_are_refused_and_the_agent_lives_on(
    raw: RawAgent, tmp_path: Path
) -> None:
    depth = 100_000
    raw.send_line(
        '{"jsonrpc":"2.0","id":4,"method":"session/new","params":' + "[" * depth + "]" * depth + "}"
    )
    err = raw.read()
    assert err["id"] is None
    assert err["error"]["code"] == -32700
    assert "nested too deeply" in err["error"]["message"]
    # a line over the 16 MiB limit is discarded, answered, and not echoed
    raw.send_line(b'{"jsonrpc":"2.0","id":5,"method":"x","params":{"p":"' + b"a" * (17 << 20))
    assert raw.proc.stdout is not None
    line = raw.proc.stdout.readline()
    assert len(line) < 4096, len(line)
    err = json.loads(line)
    assert err["error"]["code"] == -32600
    assert "over the limit of 16777216" in err["error"]["message"]
    # errors never echo a large input: the SDK's -32602 (data.errors[].input) ...
    huge = "b" * (10 << 20)
    raw.send_line(
        json.dumps(
            {"jsonrpc": "2.0", "id": 6, "method": "session/new", "params": {"cwd": 1, "x": huge}}
        )
    )
    line = raw.proc.stdout.readline()
    assert len(line) < 16384, len(line)
    assert json.loads(line)["error"]["code"] == -32602
    # ... and a library error quoting the refused value
    err = raw.request("session/new", {"cwd": "/" + "c" * (10 << 20), "mcpServers": []})
    assert len(json.dumps(err)) < 16384
    assert err["error"]["code"] == -32602
    # a long line under the limit is read whole (in 1 MiB pieces) and served
    pad = {"protocolVersion": 1, "_meta": {"pad": "p" * (3 << 20)}}
    assert raw.request("initialize", pad)["result"]["protocolVersion"] == 1
    # still serving
    work = str(workdir(tmp_path))
    sid = raw.request("session/new", {"cwd": work, "mcpServers": []})["result"]["sessionId"]
    assert sid
