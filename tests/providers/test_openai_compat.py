"""OpenAIProvider against a real local HTTP server speaking the chat-completions wire format."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from durable_harness.errors import ProviderError
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
from durable_harness.providers.openai_compat import OpenAIProvider

from .images import JPEG_B64, PNG_B64
from .servers import FakeLLMServer, StatusError, ToolCallSpec, Turn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

KEY = "sk-test-Zq9SECRETkey1234567890"
PLAIN_KEY = "plain-secret-value-777"
READ = ToolSpec(
    "read",
    "Read a file",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)


def make(srv: FakeLLMServer, **kw: Any) -> OpenAIProvider:
    kw.setdefault("api_key", KEY)
    kw.setdefault("timeout", 10.0)
    return OpenAIProvider("gpt-test", base_url=srv.openai_base_url, **kw)


def ask(text: str = "hi", **kw: Any) -> ProviderRequest:
    return ProviderRequest(messages=[{"role": "user", "content": text}], **kw)


async def collect(provider: OpenAIProvider, request: ProviderRequest) -> list[ProviderEvent]:
    return [event async for event in provider.stream(request)]


async def fail(provider: OpenAIProvider, request: ProviderRequest) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await collect(provider, request)
    return info.value


def test_satisfies_provider_protocol() -> None:
    provider = OpenAIProvider("gpt-test", api_key="k")
    assert isinstance(provider, Provider)
    assert provider.name == "openai"
    assert provider.context_window == 128_000


async def test_text_answer_streams_deltas_and_done_with_usage(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(text="Hello there, world", usage={"input": 100, "output": 7, "cacheRead": 20})
    )
    provider = make(llm_server, pricing={"input": 2.0, "output": 8.0, "cacheRead": 0.5})
    events = await collect(provider, ask(system_prompt="be brief", max_tokens=256))

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) > 1
    assert "".join(d.text for d in deltas) == "Hello there, world"
    assert isinstance(events[-1], Done)
    assert sum(isinstance(e, Done) for e in events) == 1
    msg = events[-1].message
    assert msg["role"] == "assistant"
    assert msg["content"] == [{"type": "text", "text": "Hello there, world"}]
    assert msg["provider"] == "openai"
    assert msg["model"] == "gpt-test"
    assert msg["stopReason"] == "stop"
    usage = msg["usage"]
    assert (usage["input"], usage["output"], usage["cacheRead"], usage["cacheWrite"]) == (
        100,
        7,
        20,
        0,
    )
    assert usage["totalTokens"] == 127
    assert usage["cost"]["input"] == pytest.approx(100 * 2.0 / 1e6)
    assert usage["cost"]["output"] == pytest.approx(7 * 8.0 / 1e6)
    assert usage["cost"]["cacheRead"] == pytest.approx(20 * 0.5 / 1e6)
    assert usage["cost"]["total"] == pytest.approx((200 + 56 + 10) / 1e6)

    [req] = llm_server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.headers.get("x-stainless-retry-count") == "0"
    assert req.body["model"] == "gpt-test"
    assert req.body["stream"] is True
    assert req.body["stream_options"] == {"include_usage": True}
    assert req.body["max_completion_tokens"] == 256
    assert req.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert "tools" not in req.body


async def test_tool_call_answer(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(
            text="Let me look.",
            tool_calls=[
                ToolCallSpec("call_1", "read", {"path": "a.txt", "limit": 3}),
                ToolCallSpec("call_2", "read", {"path": "b.txt"}),
            ],
            usage={"input": 50, "output": 20},
        )
    )
    events = await collect(make(llm_server), ask(tools=[READ]))

    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert calls == [
        ToolCallEvent("call_1", "read", {"path": "a.txt", "limit": 3}),
        ToolCallEvent("call_2", "read", {"path": "b.txt"}),
    ]
    done = events[-1]
    assert isinstance(done, Done)
    assert done.message["stopReason"] == "toolUse"
    assert done.message["content"] == [
        {"type": "text", "text": "Let me look."},
        {
            "type": "toolCall",
            "id": "call_1",
            "name": "read",
            "arguments": {"path": "a.txt", "limit": 3},
        },
        {"type": "toolCall", "id": "call_2", "name": "read", "arguments": {"path": "b.txt"}},
    ]
    assert llm_server.last_request.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read",
                "description": "Read a file",
                "parameters": READ.parameters,
            },
        }
    ]


async def test_conversation_with_tool_result_is_converted(llm_server: FakeLLMServer) -> None:
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
                {"type": "thinking", "thinking": "secret plan"},
                {"type": "text", "text": "Reading."},
                {"type": "toolCall", "id": "call_9", "name": "read", "arguments": {"path": "x"}},
            ],
            "provider": "openai",
            "model": "gpt-test",
            "stopReason": "toolUse",
        },
        {
            "role": "toolResult",
            "toolCallId": "call_9",
            "toolName": "read",
            "content": [{"type": "text", "text": "file body"}],
            "isError": False,
        },
        {"role": "assistant", "content": [], "stopReason": "error"},
        {"role": "user", "content": "thanks"},
    ]
    events = await collect(make(llm_server), ProviderRequest(messages=messages, tools=[READ]))
    assert isinstance(events[-1], Done)

    assert llm_server.last_request.body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path":"x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "file body"},
        {"role": "user", "content": "thanks"},
    ]


async def test_tool_result_images_follow_as_user_message(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="ok"))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "shot"},
        {"role": "assistant", "content": [{"type": "toolCall", "id": "c", "name": "shot"}]},
        {
            "role": "toolResult",
            "toolCallId": "c",
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
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
        ],
    }
    assert sent[2] == {"role": "tool", "tool_call_id": "c", "content": "png"}
    assert sent[3]["role"] == "user"
    assert sent[3]["content"][-1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/jpeg;base64,{JPEG_B64}"},
    }


async def test_reasoning_deltas_become_thinking(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="42", thinking="let me think"))
    provider = make(llm_server, reasoning=True)
    events = await collect(provider, ask(thinking_level="high"))
    thinking = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    assert thinking == "let me think"
    done = events[-1]
    assert isinstance(done, Done)
    assert done.message["content"][0] == {"type": "thinking", "thinking": "let me think"}
    assert llm_server.last_request.body["reasoning_effort"] == "high"


async def test_429_is_retryable_and_sent_once(llm_server: FakeLLMServer) -> None:
    llm_server.queue(StatusError(429, "Rate limit reached", headers={"retry-after": "7"}))
    err = await fail(make(llm_server), ask())
    assert err.retryable is True
    assert err.status == 429
    assert err.details["retry_after"] == 7.0
    assert len(llm_server.requests) == 1  # max_retries=0: the harness owns retries


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_is_retryable(llm_server: FakeLLMServer, status: int) -> None:
    llm_server.queue(StatusError(status, "upstream broke"))
    err = await fail(make(llm_server), ask())
    assert (err.retryable, err.status) == (True, status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_is_not_retryable(llm_server: FakeLLMServer, status: int) -> None:
    llm_server.queue(StatusError(status, "bad request body"))
    err = await fail(make(llm_server), ask())
    assert (err.retryable, err.status) == (False, status)
    assert "bad request body" in err.message
    assert err.code == "provider_error"


@pytest.mark.parametrize("key", [KEY, PLAIN_KEY])
async def test_api_key_never_in_error(llm_server: FakeLLMServer, key: str) -> None:
    llm_server.queue(
        StatusError(401, f"Incorrect API key provided: {key}. Header: Authorization: Bearer {key}")
    )
    err = await fail(make(llm_server, api_key=key), ask())
    assert err.retryable is False
    for text in (str(err), repr(err), err.message, json.dumps(err.to_json())):
        assert key not in text
    assert "[redacted]" in err.message


async def test_connection_drop_mid_stream_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="partial answer here", drop_after=3))
    provider = make(llm_server)
    seen: list[ProviderEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in provider.stream(ask()):
            seen.append(event)
    assert info.value.retryable is True
    assert info.value.status is None
    assert not any(isinstance(e, Done) for e in seen)


async def test_mid_stream_error_event_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(text="abcdefgh", error_after=2, error={"type": "server_error", "message": "boom"})
    )
    err = await fail(make(llm_server), ask())
    assert err.retryable is True
    assert "boom" in err.message


async def test_timeout_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="late", delay=3.0))
    err = await fail(make(llm_server, timeout=0.5), ask())
    assert err.retryable is True
    assert "timed out" in err.message


async def test_read_timeout_mid_stream_is_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="abcdefgh", delay=3.0, delay_after=2))
    err = await fail(make(llm_server, timeout=0.5), ask())
    assert err.retryable is True
    assert "timed out" in err.message


async def test_connection_refused_is_retryable() -> None:
    with FakeLLMServer() as srv:
        url = srv.openai_base_url
    provider = OpenAIProvider("gpt-test", base_url=url, api_key=KEY, timeout=5)
    err = await fail(provider, ask())
    assert err.retryable is True
    assert KEY not in err.message


async def test_invalid_tool_arguments_are_not_retryable(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(tool_calls=[ToolCallSpec("c1", "read", '{"path": ')]))
    err = await fail(make(llm_server), ask(tools=[READ]))
    assert err.retryable is False
    assert err.details["tool_call_id"] == "c1"


async def test_finish_reason_length(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="cut", stop_reason="length"))
    events = await collect(make(llm_server), ask())
    assert isinstance(events[-1], Done)
    assert events[-1].message["stopReason"] == "length"


async def test_env_fallback_and_missing_key(
    llm_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llm_server.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", PLAIN_KEY)
    llm_server.queue(Turn(text="env ok"))
    events = await collect(OpenAIProvider("gpt-env"), ask())
    assert isinstance(events[-1], Done)
    assert llm_server.last_request.headers["authorization"] == f"Bearer {PLAIN_KEY}"
    assert llm_server.last_request.body["model"] == "gpt-env"

    monkeypatch.delenv("OPENAI_API_KEY")
    err = await fail(OpenAIProvider("gpt-env"), ask())
    assert err.retryable is False
    assert len(llm_server.requests) == 1


async def test_request_model_overrides_default(llm_server: FakeLLMServer) -> None:
    llm_server.queue(Turn(text="x"))
    events = await collect(make(llm_server), ask(model="gpt-other"))
    assert llm_server.last_request.body["model"] == "gpt-other"
    assert isinstance(events[-1], Done)
    assert events[-1].message["model"] == "gpt-other"


async def test_consumer_can_stop_early(llm_server: FakeLLMServer) -> None:
    llm_server.queue(
        Turn(text="a long answer that is never read to the end", chunk_size=2), Turn(text="next")
    )
    provider = make(llm_server)
    stream = provider.stream(ask())
    with anyio.fail_after(10):
        first = await stream.__anext__()
        await stream.aclose()
    assert isinstance(first, TextDelta)
    events = await collect(provider, ask())
    assert isinstance(events[-1], Done)
