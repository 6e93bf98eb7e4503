"""The real provider adapters inside the run loop, against a local HTTP server speaking the
OpenAI and Anthropic streaming wire formats: a 429, then a tool call, then the final answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from providers.servers import FakeLLMServer, StatusError, ToolCallSpec, Turn

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.anthropic_provider import AnthropicProvider
from durable_harness.providers.base import Provider
from durable_harness.providers.openai_compat import OpenAIProvider
from durable_harness.storage import Store

from .util import EchoTool, collect_events, messages_on_path, new_session, of_type

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# An ``sk-`` shaped key (caught by the generic redaction too) and a plain one (only an exact
# replacement of the configured key catches it).
KEYS = ["sk-test-SECRETSECRET123", "plain-SECRETSECRET456"]


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


def make_provider(kind: str, srv: FakeLLMServer, key: str) -> Provider:
    if kind == "openai":
        return OpenAIProvider("gpt-test", base_url=srv.openai_base_url, api_key=key, timeout=10.0)
    return AnthropicProvider(
        "claude-test", base_url=srv.anthropic_base_url, api_key=key, timeout=10.0
    )


def sent_key(headers: dict[str, str]) -> str:
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ")


def all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("key", KEYS, ids=["sk-key", "plain-key"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_rate_limit_then_tool_then_answer(
    kind: str, key: str, store: Store, workdir: Path, tmp_path: Path, llm_server: FakeLLMServer
) -> None:
    llm_server.queue(
        StatusError(429, f"rate limited for key {key}, slow down", headers={"retry-after": "0"}),
        Turn(
            text="Let me echo.",
            tool_calls=[ToolCallSpec("call_echo_1", "echo", {"text": "hello"})],
            usage={"input": 40, "output": 9},
        ),
        Turn(text="The echo said hello.", usage={"input": 60, "output": 6}),
    )
    provider = make_provider(kind, llm_server, key)
    session = new_session(store, workdir)
    tool = EchoTool()
    options = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    async with Harness(session, provider, [tool], cwd=workdir, options=options) as h:
        events, _ = collect_events(h)
        handle = await h.prompt("please echo hello")
        outcome = await handle.wait()
    recs = session.store.records("main")
    assert outcome == "completed", [r for r in recs if r["type"] == "run_finished"]

    # The server saw three requests, all carrying the key (so the leak check is not vacuous).
    assert len(llm_server.requests) == 3
    assert all(sent_key(r.headers) == key for r in llm_server.requests)
    # The second turn's request carries the tool result.
    assert "echo: hello" in json.dumps(llm_server.requests[2].body)

    starts = of_type(recs, "provider_request_started")
    turn1 = [r for r in starts if r["turn"] == 1]
    assert [r["attempt"] for r in turn1] == [1, 2]
    assert turn1[0]["responseEntryId"] == turn1[1]["responseEntryId"]
    failed = of_type(recs, "provider_request_failed")
    assert len(failed) == 1
    assert failed[0]["status"] == 429 and failed[0]["retryable"] is True
    assert failed[0]["turn"] == 1 and failed[0]["attempt"] == 1
    assert of_type(recs, "run_finished")[0]["outcome"] == "completed"

    # Retries never grow the tree: one assistant entry per turn, the provisioned one.
    path = messages_on_path(session)
    roles = [e["message"]["role"] for e in path]
    assert roles == ["user", "assistant", "toolResult", "assistant"]
    all_assistants = [
        e for e in session.store.iter_entries(("message",)) if e["message"]["role"] == "assistant"
    ]
    assert len(all_assistants) == 2
    assert path[1]["id"] == turn1[0]["responseEntryId"]
    assert path[1]["message"]["provider"] == provider.name
    assert path[1]["message"]["usage"]["input"] == 40

    # The tool ran once, with the provider's call id.
    assert tool.calls == ["call_echo_1"]
    assert path[2]["message"]["toolCallId"] == "call_echo_1"
    assert path[2]["message"]["content"][0]["text"] == "echo: hello"
    assert path[3]["message"]["content"][0]["text"] == "The echo said hello."

    # The key appears nowhere: not in records, entries, events, nor any stored byte.
    secret_tail = key[-12:]
    dumped = json.dumps([recs, session.store.iter_entries(), events], default=str)
    assert key not in dumped and secret_tail not in dumped
    assert "[redacted]" in failed[0]["error"]
    session.close()
    stored = all_bytes(tmp_path / "jsonl") if (tmp_path / "jsonl").exists() else b""
    stored += b"".join(p.read_bytes() for p in tmp_path.glob("s.db*") if p.is_file())
    assert stored, "found no stored session bytes to scan"
    assert secret_tail.encode() not in stored


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_auth_failure_fails_the_run_without_leaking_the_key(
    kind: str, store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    key = KEYS[1]
    llm_server.queue(StatusError(401, f"invalid api key {key}"))
    session = new_session(store, workdir)
    options = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    provider = make_provider(kind, llm_server, key)
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=options) as h:
        events: list[dict[str, Any]] = []
        h.subscribe(events.append)
        handle = await h.prompt("hi")
        assert await handle.wait() == "failed"
    recs = session.store.records("main")
    assert len(llm_server.requests) == 1  # not retryable: no second attempt
    failed = of_type(recs, "provider_request_failed")
    assert len(failed) == 1 and failed[0]["status"] == 401 and failed[0]["retryable"] is False
    finished = of_type(recs, "run_finished")[0]
    assert finished["outcome"] == "failed"
    dumped = json.dumps([recs, session.store.iter_entries(), events], default=str)
    assert "SECRETSECRET456" not in dumped
    assert not [e for e in messages_on_path(session) if e["message"]["role"] == "assistant"]
