"""A cut provider stream is a failed attempt, never an answer (issue 20): both network providers
against a real local server whose stream ends without its end marker (OpenAI: no
``finish_reason``, no ``[DONE]``; Anthropic: no ``message_stop``), is cut inside a tool call's
arguments, has its connection dropped or reset, or goes silent past the idle timeout. Each is a
retryable :class:`ProviderError` with ``details["reason"]`` ``stream_truncated`` (or
``stream_idle_timeout``), and no :class:`Done` is yielded."""

from __future__ import annotations

import time
from typing import Any

import pytest

from durable_harness.errors import FormatError, ProviderError
from durable_harness.providers import make_provider
from durable_harness.providers.anthropic_provider import AnthropicProvider
from durable_harness.providers.base import (
    STREAM_IDLE_TIMEOUT,
    STREAM_TRUNCATED,
    Done,
    Provider,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ToolSpec,
)
from durable_harness.providers.failures import DEFAULT_IDLE_TIMEOUT, IDLE_TIMEOUT_ENV
from durable_harness.providers.openai_compat import OpenAIProvider

from .servers import FakeLLMServer, ToolCallSpec, Turn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

KEY = "sk-test-cut-streams-0001"
READ = ToolSpec("read", "Read a file", {"type": "object", "properties": {"path": {}}})
PARTIAL = "PARTIAL-answer-text"  # streamed in pieces of 4 characters


def make(kind: str, srv: FakeLLMServer, **kw: Any) -> Provider:
    kw.setdefault("api_key", KEY)
    kw.setdefault("timeout", 10.0)
    if kind == "openai":
        return OpenAIProvider("gpt-test", base_url=srv.openai_base_url, **kw)
    return AnthropicProvider("claude-test", base_url=srv.anthropic_base_url, **kw)


def ask(tools: list[ToolSpec] | None = None) -> ProviderRequest:
    return ProviderRequest(messages=[{"role": "user", "content": "hi"}], tools=tools or [])


async def play(provider: Provider, request: ProviderRequest) -> tuple[list[ProviderEvent], Any]:
    """Every event the stream yields, and the error that ended it (``None`` when none)."""
    seen: list[ProviderEvent] = []
    try:
        async for event in provider.stream(request):
            seen.append(event)
    except ProviderError as exc:
        return seen, exc
    return seen, None


# The SSE events each wire format sends for a text answer of PARTIAL (5 pieces):
# OpenAI: role chunk, 5 text chunks, the finish_reason chunk, the usage chunk (then [DONE]).
# Anthropic: message_start, ping, block start, 5 deltas, block stop, message_delta, message_stop.
# For one tool call (arguments in two pieces):
# OpenAI: role chunk, call start, 2 argument chunks, finish_reason, usage.
# Anthropic: message_start, ping, block start, 2 input_json deltas, block stop, message_delta,
# message_stop.
CUTS: dict[str, dict[str, Turn]] = {
    "openai": {
        "no_end_marker": Turn(text=PARTIAL, end_after=4),  # neither finish_reason nor [DONE]
        "in_tool_arguments": Turn(
            tool_calls=[ToolCallSpec("c1", "read", {"path": "notes.txt"})], end_after=3
        ),
        "dropped": Turn(text=PARTIAL, drop_after=4),
        "reset": Turn(text=PARTIAL, reset_after=4),
    },
    "anthropic": {
        "no_end_marker": Turn(text=PARTIAL, end_after=-1),  # everything but message_stop
        "in_tool_arguments": Turn(
            tool_calls=[ToolCallSpec("toolu_1", "read", {"path": "notes.txt"})], end_after=4
        ),
        "dropped": Turn(text=PARTIAL, drop_after=5),
        "reset": Turn(text=PARTIAL, reset_after=5),
    },
}


@pytest.mark.parametrize("cut", ["no_end_marker", "in_tool_arguments", "dropped", "reset"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_cut_stream_is_a_retryable_truncation(
    kind: str, cut: str, llm_server: FakeLLMServer
) -> None:
    llm_server.queue(CUTS[kind][cut])
    seen, err = await play(make(kind, llm_server), ask(tools=[READ]))
    assert err is not None, f"a {cut} stream was taken as an answer: {seen}"
    assert err.retryable is True
    assert err.status is None
    assert err.details["reason"] == STREAM_TRUNCATED, err.message
    assert "incomplete" in err.message
    assert KEY not in err.message
    assert not any(isinstance(e, Done) for e in seen)
    if cut == "reset":  # a real RST, told apart from the FIN of "dropped"
        assert "Connection reset" in err.message, err.message
    if cut != "in_tool_arguments":  # the partial text did stream (so the test is not vacuous)
        assert "".join(e.text for e in seen if isinstance(e, TextDelta)).startswith("PART")


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_cut_after_a_complete_tool_call_is_still_no_answer(
    kind: str, llm_server: FakeLLMServer
) -> None:
    """Two tool calls, the stream cut after the first is complete: the first call's event was
    yielded, but without the end marker nothing is an answer."""
    calls = [
        ToolCallSpec("call_a", "read", {"path": "a.txt"}),
        ToolCallSpec("call_b", "read", {"path": "b.txt"}),
    ]
    # Anthropic: start, ping, [start, 2 deltas, stop] x2: cut inside the second block's deltas.
    # OpenAI: role, [start, 2 args] x2: cut inside the second call's arguments.
    llm_server.queue(Turn(tool_calls=calls, end_after=8 if kind == "anthropic" else 6))
    seen, err = await play(make(kind, llm_server), ask(tools=[READ]))
    assert err is not None and err.details["reason"] == STREAM_TRUNCATED
    assert not any(isinstance(e, Done) for e in seen)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_idle_stream_fails_after_the_idle_timeout(
    kind: str, llm_server: FakeLLMServer
) -> None:
    # stall for 5 s after a few events; the idle timeout is 0.4 s, the request timeout 10 s
    llm_server.queue(Turn(text=PARTIAL, delay=5.0, delay_after=3))
    provider = make(kind, llm_server, idle_timeout=0.4)
    start = time.monotonic()
    seen, err = await play(provider, ask())
    elapsed = time.monotonic() - start
    assert err is not None
    assert err.retryable is True
    assert err.details["reason"] == STREAM_IDLE_TIMEOUT, err.message
    assert "0.4 s" in err.message
    assert elapsed < 4.0  # the idle timeout fired, not the server's stall ending
    assert not any(isinstance(e, Done) for e in seen)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_stream_with_pauses_under_the_idle_timeout_completes(
    kind: str, llm_server: FakeLLMServer
) -> None:
    llm_server.queue(Turn(text="slow but whole", delay=0.3, delay_after=3))
    seen, err = await play(make(kind, llm_server, idle_timeout=2.0), ask())
    assert err is None
    done = seen[-1]
    assert isinstance(done, Done)
    assert done.message["content"][-1]["text"] == "slow but whole"


async def test_openai_finish_reason_without_done_or_usage_is_an_answer(
    llm_server: FakeLLMServer,
) -> None:
    """The end marker is ``finish_reason``: a stream that carried it and then ended without
    the usage chunk and ``[DONE]`` is complete (its usage is unknown: zeros)."""
    llm_server.queue(Turn(text="whole answer", usage={"input": 5, "output": 2}, end_after=-1))
    seen, err = await play(make("openai", llm_server), ask())
    assert err is None
    done = seen[-1]
    assert isinstance(done, Done)
    assert done.message["stopReason"] == "stop"
    assert done.message["content"] == [{"type": "text", "text": "whole answer"}]
    assert done.message["usage"]["totalTokens"] == 0


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_complete_stream_with_malformed_tool_arguments_is_still_not_retryable(
    kind: str, llm_server: FakeLLMServer
) -> None:
    """Unchanged: a complete answer whose arguments are not JSON is the model's, not a cut."""
    llm_server.queue(Turn(tool_calls=[ToolCallSpec("c9", "read", '{"path": ')]))
    _, err = await play(make(kind, llm_server), ask(tools=[READ]))
    assert err is not None and err.retryable is False
    assert "reason" not in err.details


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_idle_timeout_default_and_environment(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IDLE_TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(f"{kind.upper()}_API_KEY", KEY)
    spec = f"{kind}:some-model"
    provider: Any = make_provider(spec)
    assert provider.idle_timeout == DEFAULT_IDLE_TIMEOUT == 300.0
    monkeypatch.setenv(IDLE_TIMEOUT_ENV, "12.5")
    provider = make_provider(spec)
    assert provider.idle_timeout == 12.5
    assert provider.read_timeout == 12.5
    cls = OpenAIProvider if kind == "openai" else AnthropicProvider
    assert cls("m", api_key=KEY, idle_timeout=3).idle_timeout == 3.0  # the argument wins
    assert cls("m", api_key=KEY, timeout=2.0).read_timeout == 2.0  # at most the timeout
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(IDLE_TIMEOUT_ENV, bad)
        with pytest.raises(FormatError) as info:
            make_provider(spec)
        assert IDLE_TIMEOUT_ENV in info.value.message
    with pytest.raises(FormatError):
        cls("m", api_key=KEY, idle_timeout=0)
