"""AnthropicProvider against a real local HTTP server speaking the Messages API wire format."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from durable_harness.errors import ProviderError
from durable_harness.providers.anthropic_provider import AnthropicProvider, wire_tool_id
from durable_harness.providers.base import (
    Done,
    Provider,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
)

from .images import JPEG_B64, PNG_B64
from .servers import FakeLLMServer, StatusError, ToolCallSpec, Turn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

KEY = "sk-ant-api03-SECRETkeyValue1234567890"
PLAIN_KEY = "plain-secret-value-888"
READ = ToolSpec(
    "read",
    "Read a file",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def make(srv: FakeLLMServer, **kw: Any) -> AnthropicProvider:
    kw.setdefault("api_key", KEY)
    kw.setdefault("timeout", 10.0)
    return AnthropicProvider("claude-test", base_url=srv.anthropic_base_url, **kw)


def sent_key(headers: dict[str, str]) -> str:
    """The API key as the SDK sent it (``x-api-key`` or, in newer SDKs, a bearer token)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ")


def ask(text: str = "hi", **kw: Any) -> ProviderRequest:
    return ProviderRequest(messages=[{"role": "user", "content": text}], **kw)


async def collect(provider: AnthropicProvider, request: ProviderRequest) -> list[ProviderEvent]:
    return [event async for event in provider.stream(request)]


async def fail(provider: AnthropicProvider, request: ProviderRequest) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await collect(provider, request)
    return info.value


def test_satisfies_provider_protocol() -> None:
    provider = AnthropicProvider("claude-test", api_key="k")
    assert isinstance(provider, Provider)
    assert provider.name == "anthropic"
    assert provider.context_window == 200_000
    assert provider.max_tokens == 4096


def test_wire_tool_id() -> None:
    assert wire_tool_id("toolu_01AbC-9") == "toolu_01AbC-9"
    assert wire_tool_id("call_1|fc_2") == "call_1_fc_2"
    assert len(wire_tool_id("x" * 100)) == 64


async def test_text_answer_streams_deltas_and_done_with_usage(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(
            text="Hello there, world",
            usage={"input": 100, "output": 7, "cacheRead": 20, "cacheWrite": 5},
        )
    )
    pricing = {"input": 3.0, "output": 15.0, "cacheRead": 0.3, "cacheWrite": 3.75}
    provider = make(llm_server, pricing=pricing)
    events = await collect(provider, ask(system_prompt="be brief"))

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == "Hello there, world"
    assert isinstance(events[-1], Done)
    assert sum(isinstance(e, Done) for e in events) == 1
    msg = events[-1].message
    assert msg["role"] == "assistant"
    assert msg["content"] == [{"type": "text", "text": "Hello there, world"}]
    assert msg["provider"] == "anthropic"
    assert msg["model"] == "claude-test"
    assert msg["stopReason"] == "stop"
    usage = msg["usage"]
    assert (usage["input"], usage["output"], usage["cacheRead"], usage["cacheWrite"]) == (
        100,
        7,
        20,
        5,
    )
    assert usage["totalTokens"] == 132
    expected = {k: usage[k] * pricing[k] / 1e6 for k in pricing}
    for key, value in expected.items():
        assert usage["cost"][key] == pytest.approx(value)
    assert usage["cost"]["total"] == pytest.approx(sum(expected.values()))

    [req] = llm_server.requests
    assert req.path == "/v1/messages"
    assert sent_key(req.headers) == KEY
    assert "anthropic-version" in req.headers
    assert req.headers.get("x-stainless-retry-count") == "0"
    assert req.body["model"] == "claude-test"
    assert req.body["stream"] is True
    assert req.body["max_tokens"] == 4096
    assert req.body["system"] == "be brief"
    assert req.body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in req.body
    assert "thinking" not in req.body


async def test_tool_call_answer(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(
            text="Let me look.",
            tool_calls=[
                ToolCallSpec("toolu_1", "read", {"path": "a.txt", "limit": 3}),
                ToolCallSpec("toolu_2", "read", {"path": "b.txt"}),
            ],
            usage={"input": 50, "output": 20},
        )
    )
    events = await collect(make(llm_server), ask(tools=[READ], max_tokens=1000))

    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert calls == [
        ToolCallEvent("toolu_1", "read", {"path": "a.txt", "limit": 3}),
        ToolCallEvent("toolu_2", "read", {"path": "b.txt"}),
    ]
    done = events[-1]
    assert isinstance(done, Done)
    assert done.message["stopReason"] == "toolUse"
    assert done.message["content"] == [
        {"type": "text", "text": "Let me look."},
        {
            "type": "toolCall",
            "id": "toolu_1",
            "name": "read",
            "arguments": {"path": "a.txt", "limit": 3},
        },
        {"type": "toolCall", "id": "toolu_2", "name": "read", "arguments": {"path": "b.txt"}},
    ]
    assert done.message["usage"]["output"] == 20
    body = llm_server.last_request.body
    assert body["max_tokens"] == 1000
    assert body["tools"] == [
        {"name": "read", "description": "Read a file", "input_schema": READ.parameters}
    ]


async def test_conversation_with_tool_results_is_converted(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="done"))
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this"},
                {"type": "image", "data": PNG_B64, "mimeType": "image/png"},
            ],
            "timestamp": 1,
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "signed plan", "thinkingSignature": "sig-A"},
                {"type": "thinking", "thinking": "unsigned plan"},
                {
                    "type": "thinking",
                    "thinking": "",
                    "thinkingSignature": "opaque",
                    "redacted": True,
                },
                {"type": "text", "text": "Reading both."},
                {"type": "toolCall", "id": "toolu_a", "name": "read", "arguments": {"path": "x"}},
                {"type": "toolCall", "id": "call|b", "name": "read", "arguments": {"path": "y"}},
            ],
            "provider": "anthropic",
            "model": "claude-test",
            "stopReason": "toolUse",
        },
        {
            "role": "toolResult",
            "toolCallId": "toolu_a",
            "toolName": "read",
            "content": [{"type": "text", "text": "file x"}],
            "isError": False,
        },
        {
            "role": "toolResult",
            "toolCallId": "call|b",
            "toolName": "read",
            "content": [{"type": "text", "text": "no such file"}],
            "isError": True,
        },
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "dropped"}]},
        {"role": "user", "content": "thanks"},
    ]
    events = await collect(
        make(llm_server), ProviderRequest(messages=messages, tools=[READ], system_prompt="sys")
    )
    assert isinstance(events[-1], Done)

    body = llm_server.last_request.body
    assert body["system"] == "sys"
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "signed plan", "signature": "sig-A"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "x"}},
                {"type": "tool_use", "id": "call_b", "name": "read", "input": {"path": "y"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "file x"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": "no such file",
                    "is_error": True,
                },
            ],
        },
        {"role": "user", "content": "thanks"},
    ]


async def test_tool_result_with_image_keeps_blocks(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="ok"))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "shot"},
        {"role": "assistant", "content": [{"type": "toolCall", "id": "t1", "name": "shot"}]},
        {
            "role": "toolResult",
            "toolCallId": "t1",
            "toolName": "shot",
            "content": [
                {"type": "text", "text": "png"},
                {"type": "image", "data": JPEG_B64, "mimeType": "image/jpeg"},
            ],
        },
    ]
    await collect(make(llm_server), ProviderRequest(messages=messages))
    sent = llm_server.last_request.body["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
    }
    assert sent[2]["content"][0]["content"] == [
        {"type": "text", "text": "png"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/jpeg", "data": JPEG_B64},
        },
    ]


async def test_thinking_streams_and_keeps_signature(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="42", thinking="let me think", signature="sig-XYZ"))
    provider = make(llm_server, reasoning=True)
    events = await collect(provider, ask(thinking_level="medium", max_tokens=2000))
    assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == "let me think"
    done = events[-1]
    assert isinstance(done, Done)
    assert done.message["content"] == [
        {"type": "thinking", "thinking": "let me think", "thinkingSignature": "sig-XYZ"},
        {"type": "text", "text": "42"},
    ]
    body = llm_server.last_request.body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert body["max_tokens"] == 2000 + 8192


async def test_429_is_retryable_and_sent_once(llm_server: FakeLLMServer) -> None:
    llm_server.queue(StatusError(429, "Rate limit reached", headers={"retry-after": "7"}))
    err = await fail(make(llm_server), ask())
    assert err.retryable is True
    assert err.status == 429
    assert err.details["retry_after"] == 7.0
    assert err.details["error_type"] == "rate_limit_error"
    assert len(llm_server.requests) == 1  # max_retries=0: the harness owns retries


@pytest.mark.parametrize("status", [500, 503, 529])
async def test_5xx_and_overloaded_are_retryable(llm_server: FakeLLMServer, status: int) -> None:
    llm_server.queue(StatusError(status, "upstream broke"))
    err = await fail(make(llm_server), ask())
    assert (err.retryable, err.status) == (True, status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413])
async def test_other_4xx_is_not_retryable(llm_server: FakeLLMServer, status: int) -> None:
    llm_server.queue(StatusError(status, "bad request body"))
    err = await fail(make(llm_server), ask())
    assert (err.retryable, err.status) == (False, status)
    assert "bad request body" in err.message
    assert err.code == "provider_error"


@pytest.mark.parametrize("key", [KEY, PLAIN_KEY])
async def test_api_key_never_in_error(llm_server: FakeLLMServer, key: str) -> None:
    llm_server.queue(StatusError(401, f"invalid x-api-key: {key} (Authorization: Bearer {key})"))
    err = await fail(make(llm_server, api_key=key), ask())
    assert err.retryable is False
    for text in (str(err), repr(err), err.message, json.dumps(err.to_json())):
        assert key not in text
    assert "[redacted]" in err.message


async def test_connection_drop_mid_stream_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="partial answer here", drop_after=5))
    provider = make(llm_server)
    seen: list[ProviderEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in provider.stream(ask()):
            seen.append(event)
    assert info.value.retryable is True
    assert info.value.status is None
    assert any(isinstance(e, TextDelta) for e in seen)
    assert not any(isinstance(e, Done) for e in seen)


async def test_mid_stream_overloaded_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="abcdefgh", error_after=4))
    err = await fail(make(llm_server), ask())
    assert err.retryable is True
    assert err.details["error_type"] == "overloaded_error"


async def test_mid_stream_invalid_request_is_not_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(text="abc", error_after=3, error={"type": "invalid_request_error", "message": "no"})
    )
    err = await fail(make(llm_server), ask())
    assert err.retryable is False


async def test_timeout_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="late", delay=3.0))
    err = await fail(make(llm_server, timeout=0.5), ask())
    assert err.retryable is True
    assert "timed out" in err.message


async def test_read_timeout_mid_stream_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="abcdefgh", delay=3.0, delay_after=4))
    err = await fail(make(llm_server, timeout=0.5), ask())
    assert err.retryable is True
    assert "timed out" in err.message


async def test_connection_refused_is_retryable() -> None:
    with FakeLLMServer() as srv:
        url = srv.anthropic_base_url
    provider = AnthropicProvider("claude-test", base_url=url, api_key=KEY, timeout=5)
    err = await fail(provider, ask())
    assert err.retryable is True
    assert KEY not in err.message


async def test_invalid_tool_arguments_are_not_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(tool_calls=[ToolCallSpec("toolu_1", "read", '{"path": ')]))
    err = await fail(make(llm_server), ask(tools=[READ]))
    assert err.retryable is False
    assert err.details["tool_call_id"] == "toolu_1"


@pytest.mark.parametrize(
    ("wire", "ours"),
    [("max_tokens", "length"), ("stop_sequence", "stop"), ("refusal", "error")],
)
async def test_stop_reasons(llm_server: FakeLLMServer, wire: str, ours: str) -> None:
    llm_server.queue(Turn(text="cut", stop_reason=wire))
    events = await collect(make(llm_server), ask())
    assert isinstance(events[-1], Done)
    assert events[-1].message["stopReason"] == ours


async def test_env_fallback_and_missing_key(
    llm_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", llm_server.anthropic_base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PLAIN_KEY)
    llm_server.queue(Turn(text="env ok"))
    events = await collect(AnthropicProvider("claude-env"), ask())
    assert isinstance(events[-1], Done)
    assert sent_key(llm_server.last_request.headers) == PLAIN_KEY
    assert llm_server.last_request.body["model"] == "claude-env"

    monkeypatch.delenv("ANTHROPIC_API_KEY")
    err = await fail(AnthropicProvider("claude-env"), ask())
    assert err.retryable is False
    assert len(llm_server.requests) == 1


async def test_consumer_can_stop_early(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(text="a long answer that is never read to the end", chunk_size=2),
        Turn(text="next"),
    )
    provider = make(llm_server)
    stream = provider.stream(ask())
    with anyio.fail_after(10):
        first = await stream.__anext__()
        await stream.aclose()
    assert isinstance(first, TextDelta)
    events = await collect(provider, ask())
    assert isinstance(events[-1], Done)
