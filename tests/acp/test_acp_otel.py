"""``durable-harness acp`` configured by the ``OTEL_*`` variables alone exports the GenAI spans of
its prompts to an OTLP receiver, and ``--log-format json`` keeps its stderr JSON lines while
stdout carries the protocol (issue 23; ``design/observability.md``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="no OTLP exporter")

from acp import text_block
from acp_helpers import RecordingClient, agent, script
from otlp_receiver import Receiver, otel_env

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


async def test_acp_exports_spans_and_logs_json(tmp_path: Path, receiver: Receiver) -> None:
    work = tmp_path / "work"
    work.mkdir()
    turns = [
        {"text": "Looking.", "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
        {"text": "Done.", "usage": {"input": 9, "output": 2, "cacheRead": 3}},
    ]
    client = RecordingClient()
    provider = script(tmp_path, turns)
    extra = ("--log-format", "json")
    async with agent(tmp_path, provider, client, extra=extra, env_extra=otel_env(receiver)) as (
        conn,
        _proc,
    ):
        new = await conn.new_session(cwd=str(work))
        done = await conn.prompt(session_id=new.session_id, prompt=[text_block("go")])
    assert done.stop_reason == "end_turn"
    # the agent exited when its stdin closed: the spans were flushed on the way out
    chats = [
        s for s in receiver.named("chat ") if s["attrs"]["gen_ai.conversation.id"] == new.session_id
    ]
    assert sorted(s["attrs"]["gen_ai.response.finish_reasons"] for s in chats) == [
        ("stop",),
        ("tool_call",),
    ]
    (last,) = [s for s in chats if s["attrs"]["gen_ai.response.finish_reasons"] == ("stop",)]
    assert last["attrs"]["gen_ai.usage.input_tokens"] == 12
    (tool,) = receiver.named("execute_tool bash")
    assert tool["attrs"]["gen_ai.tool.call.id"]
    assert tool["attrs"]["gen_ai.conversation.id"] == new.session_id
    (log,) = sorted(tmp_path.glob("agent-*.log"))
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    states = [r["state"] for r in records if r["event"] == "lifecycle"]
    assert states[:1] == ["idle"] and "running" in states
    assert {r.get("session_id") for r in records if r["event"] == "run_end"} == {new.session_id}
