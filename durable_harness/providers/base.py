"""The provider protocol: one streaming verb, :meth:`Provider.stream`.

A provider turns a :class:`ProviderRequest` (the context messages in pi's shapes, the tools'
JSON schemas, the model and thinking level) into an async stream of :data:`ProviderEvent`,
ending with exactly one :class:`Done` that carries the complete assistant message dict::

    {"role": "assistant", "content": [text | thinking | toolCall blocks],
     "provider": str, "model": str, "usage": {input, output, cacheRead, cacheWrite,
     totalTokens, cost{...} (USD)}, "stopReason": "stop" | "length" | "toolUse" | "error"}

Failures raise :class:`~durable_harness.errors.ProviderError` with ``retryable`` set by the one
rule in :mod:`durable_harness.providers.failures`, which also says when a stream is an answer
(only once the wire's end marker arrived: else :data:`STREAM_TRUNCATED` or
:data:`STREAM_IDLE_TIMEOUT`). Providers never retry by themselves: the harness does, writing a
``provider_request_started`` record per attempt.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

STREAM_TRUNCATED = "stream_truncated"
"""``ProviderError.details["reason"]`` of a stream that ended before its end marker (OpenAI's
``finish_reason``, Anthropic's ``message_stop``, or no :class:`Done` at all): cleanly, or by the
connection dropping or being reset mid-stream."""

STREAM_IDLE_TIMEOUT = "stream_idle_timeout"
"""``ProviderError.details["reason"]`` of a stream that sent nothing (not even a keep-alive)
for the provider's idle timeout."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the provider sees it: ``name``, ``description`` and a JSON-schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ProviderRequest:
    """One provider request.

    Attributes:
        messages: context messages (``user``/``assistant``/``toolResult`` dicts, pi shapes).
        tools: the tools offered.
        model: model id (provider-specific string).
        system_prompt: system text or ``None``.
        thinking_level: ``off``, ``minimal``, ``low``, ``medium``, ``high``.
        run_id: the run this request belongs to ("" for compaction/summaries outside a run).
        turn: 1-based index of the assistant message this request produces within the run.
        attempt: 1-based attempt number, counted durably across restarts.
        max_tokens: output cap in tokens, or ``None`` for the provider's default.
        purpose: ``turn``, ``compaction`` or ``branch_summary``.
        prompt: the text of the prompt that started the run ("" outside a run).
    """

    messages: list[dict[str, Any]]
    tools: list[ToolSpec] = field(default_factory=list)
    model: str = ""
    system_prompt: str | None = None
    thinking_level: str = "off"
    run_id: str = ""
    turn: int = 1
    attempt: int = 1
    max_tokens: int | None = None
    purpose: str = "turn"
    prompt: str = ""


@dataclass(frozen=True)
class TextDelta:
    """A piece of answer text."""

    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """A piece of reasoning text."""

    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete tool call (``id``, ``name``, parsed ``arguments``)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Done:
    """The end of the stream with the complete assistant ``message`` dict."""

    message: dict[str, Any]


ProviderEvent = TextDelta | ThinkingDelta | ToolCallEvent | Done


@runtime_checkable
class Provider(Protocol):
    """What the harness needs from a provider.

    Attributes:
        name: provider name recorded on assistant messages (``scripted``, ``openai``...).
        model: default model id.
        context_window: the model's context window in tokens (drives auto-compaction).
    """

    name: str
    model: str
    context_window: int

    def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Stream the answer to ``request``; the last event is :class:`Done`.

        Raises:
            ProviderError: the request failed (``retryable`` says if a retry may help).
        """
        ...


def empty_usage() -> dict[str, Any]:
    """Return a zero usage dict in pi's shape (tokens) whose ``cost`` is ``None``: unknown
    until :func:`priced` (or a provider that reports its cost) sets it."""
    return {
        "input": 0,
        "output": 0,
        "cacheRead": 0,
        "cacheWrite": 0,
        "totalTokens": 0,
        "cost": None,
    }


PRICE_KEYS = ("input", "output", "cacheRead", "cacheWrite")
"""The token kinds a price table prices (USD per million tokens each)."""


def priced(usage: dict[str, Any], pricing: Mapping[str, float] | None) -> dict[str, Any]:
    """Set ``usage["cost"]`` from its token counts and ``pricing`` (USD per million tokens,
    keys :data:`PRICE_KEYS`) and return ``usage``. ``cost.total`` is the sum of the four.

    An unknown price is an unknown cost, never zero (``design/run-loop.md``, "Cost"): with no
    ``pricing``, or a ``pricing`` lacking the price of a token kind the usage has, ``cost``
    is ``None``. A kind with no tokens costs 0 whether priced or not."""
    cost: dict[str, float] = {}
    for key in PRICE_KEYS:
        tokens = float(usage.get(key, 0) or 0)
        price = (pricing or {}).get(key)
        if price is None and tokens:
            usage["cost"] = None
            return usage
        cost[key] = tokens * float(price or 0.0) / 1_000_000
    usage["cost"] = {**cost, "total": sum(cost.values())} if pricing else None
    return usage


def foreign_thinking_text(block: Mapping[str, Any]) -> str:
    """The text another model's ``thinking`` block is sent as ('' to leave it out: redacted or
    blank), as pi-ai's ``transformMessages`` does (``design/context.md``, "pi sessions")."""
    if block.get("redacted"):
        return ""
    text = str(block.get("thinking") or "")
    return text if text.strip() else ""


def arguments_json(arguments: Any) -> str:
    """Tool-call arguments as the wire's JSON string: compact, non-ASCII kept, as JavaScript's
    ``JSON.stringify`` spells them (what pi sends; ``design/context.md``, "pi sessions")."""
    return json.dumps(arguments or {}, separators=(",", ":"), ensure_ascii=False)
