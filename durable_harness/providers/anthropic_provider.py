"""Anthropic Messages API provider.

Uses the official ``anthropic`` SDK: ``AsyncAnthropic(max_retries=0).messages.create(stream=True)``
and reads the raw server-sent events. The SDK never retries: the harness does, writing one
``provider_request_started`` record per attempt.

Wire mapping (pi message shapes -> Messages API):

* The system prompt goes to the top-level ``system`` field.
* ``user``: a string stays a string; text/image blocks become ``{"type": "text"}`` /
  ``{"type": "image", "source": {"type": "base64", "media_type", "data"}}`` blocks.
* ``assistant``: text blocks (non-empty) stay text; ``toolCall`` blocks become ``tool_use`` with
  ``input=arguments``. A ``thinking`` block is re-sent only when its signature
  (``thinkingSignature``, pi's field, or ``signature``) was issued for this provider and model:
  the message's ``provider`` and ``model`` are the request's. Then it goes out as ``thinking``
  (or ``redacted_thinking`` when marked ``redacted``), unmodified, as the extended-thinking
  guide requires. Any other thinking (another provider's or model's, or unsigned) is left out:
  a foreign signature fails Anthropic's check, and the API drops earlier turns' thinking from
  what the model sees anyway. With thinking enabled, a request whose open tool-use turn (the
  last assistant message, answered by tool results) does not start with a kept thinking block
  is sent with thinking off, since the API requires that turn to start with one.
* Images (user content and tool results) are checked against :data:`ANTHROPIC_IMAGES` (JPEG,
  PNG, GIF, WebP, 5 MB): one the API would refuse becomes a short text note
  (:func:`~durable_harness.providers._wire.check_image`).
* Consecutive ``toolResult`` messages become one user message of ``tool_result`` blocks
  (``tool_use_id``, ``content`` text - or text and image blocks -, ``is_error``).
* Tool-call ids are reduced to ``[A-Za-z0-9_-]{1,64}``; ids that would collide once reduced get
  a ``_2``... suffix, the same on the ``tool_use`` and its ``tool_result``.

Stream mapping: ``text_delta`` -> :class:`TextDelta`, ``thinking_delta`` ->
:class:`ThinkingDelta`, ``input_json_delta`` accumulated per block and yielded as one
:class:`ToolCallEvent` at ``content_block_stop``, then :class:`Done`. A stream without
``message_stop`` is cut short, never an answer
(:func:`~durable_harness.providers.failures.stream_ended_early`).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, cast

import anthropic
import anyio

from durable_harness.errors import ProviderError
from durable_harness.providers import CREDENTIAL_ENV
from durable_harness.providers._wire import (
    ANTHROPIC_IMAGES,
    WireIds,
    check_image,
    client_options,
    close_stream,
    parse_tool_arguments,
    setting,
    stream_closing,
)
from durable_harness.providers.base import (
    Done,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    empty_usage,
    priced,
)
from durable_harness.providers.failures import (
    TRANSPORT_ERRORS,
    error_body,
    idle_timeout_setting,
    retry_after,
    retryable_error_type,
    retryable_status,
    scrub,
    stream_broken,
    stream_ended_early,
)

__all__ = [
    "ANTHROPIC_IMAGES",
    "AnthropicProvider",
    "to_anthropic_messages",
    "to_anthropic_tools",
    "wire_tool_id",
]

_BROKEN: tuple[type[BaseException], ...] = (anthropic.APIConnectionError, *TRANSPORT_ERRORS)
"""A stream's connection breaking after the HTTP 200 answer (the SDK's ``APIConnectionError``
and its ``APITimeoutError`` subclass, or the HTTP library's own error): ``stream_broken``."""

_KEY_ENV = CREDENTIAL_ENV["anthropic"]
"""The environment variable holding the API key when ``api_key`` is not given."""

_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "toolUse",
    "refusal": "error",
}
_THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class AnthropicProvider:
    """A :class:`~durable_harness.providers.base.Provider` over the Anthropic Messages API.

    Args:
        model: default model id (a request's non-empty ``model`` overrides it).
        base_url: API root such as ``https://api.anthropic.com``; falls back to the
            ``ANTHROPIC_BASE_URL`` environment variable, then the SDK default.
        api_key: the API key; falls back to ``ANTHROPIC_API_KEY``. Never appears in errors.
            Because a key is always passed explicitly, the SDK never loads profiles from disk.
        context_window: the model's context window in tokens (default 200000).
        max_tokens: output cap in tokens when the request sets none (default 4096).
        timeout: seconds allowed for each phase of a request: connecting, sending, waiting
            for a pooled connection, and each read (default 600).
        idle_timeout: seconds the server may stay silent while the request waits for its
            answer or its stream runs: each read of the connection, at most ``timeout``
            (``ping`` events reset it). ``None`` takes ``DURABLE_HARNESS_STREAM_IDLE_TIMEOUT``,
            else 300 (the default of OpenAI Codex's ``stream_idle_timeout_ms``). Past it the
            attempt fails with reason ``stream_idle_timeout`` (retryable).
        pricing: USD per million tokens, keys ``input``, ``output``, ``cacheRead``,
            ``cacheWrite`` (missing keys cost 0); ``None`` leaves every cost at 0.
        reasoning: enable extended thinking from the request's ``thinking_level`` (budget
            1024/2048/8192/16384 tokens for minimal/low/medium/high, added to ``max_tokens``).
        name: provider name written on assistant messages (default ``anthropic``).

    Raises:
        FormatError: ``idle_timeout`` (or its environment variable) is not a positive number.
        ProviderError: (from :meth:`stream`) no API key is configured (``retryable=False``).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        context_window: int = 200_000,
        max_tokens: int = 4096,
        timeout: float = 600.0,
        idle_timeout: float | None = None,
        pricing: Mapping[str, float] | None = None,
        reasoning: bool = False,
        name: str = "anthropic",
    ) -> None:
        self.name = name
        self.model = model
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.base_url = setting(base_url, "ANTHROPIC_BASE_URL")
        self._api_key = setting(api_key, _KEY_ENV)
        self.timeout = timeout
        self.idle_timeout = idle_timeout_setting(idle_timeout)
        self.read_timeout = min(self.timeout, self.idle_timeout)
        self.pricing = dict(pricing) if pricing else None
        self.reasoning = reasoning

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={self.base_url!r})"

    def _client(self) -> Any:
        """A fresh SDK client (no retries of its own: the harness retries).

        Raises:
            ProviderError: no API key (``retryable=False``).
        """
        options = client_options(
            provider=self.name,
            api_key=self._api_key,
            key_env=_KEY_ENV,
            base_url=self.base_url,
            timeout=anthropic.Timeout(self.timeout, read=self.read_timeout),
        )
        return anthropic.AsyncAnthropic(**options)

    def build_params(self, request: ProviderRequest) -> dict[str, Any]:
        """Return the keyword arguments of ``messages.create`` for ``request``.

        Shape: ``{"model", "max_tokens", "messages", "stream": True, ["system"], ["tools"],
        ["thinking"]}``.
        """
        max_tokens = request.max_tokens or self.max_tokens
        model = request.model or self.model
        messages = to_anthropic_messages(request.messages, provider=self.name, model=model)
        params: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": messages,
            "stream": True,
        }
        if request.system_prompt:
            params["system"] = request.system_prompt
        if request.tools:
            params["tools"] = to_anthropic_tools(request.tools)
        budget = _THINKING_BUDGETS.get(request.thinking_level)
        if self.reasoning and budget and _thinking_allowed(messages):
            params["thinking"] = {"type": "enabled", "budget_tokens": budget}
            params["max_tokens"] = max_tokens + budget
        return params

    def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Stream the answer to ``request``: deltas and tool calls, then one :class:`Done`.

        The ``Done`` message is ``{"role": "assistant", "content": [thinking | text | toolCall
        blocks in stream order], "provider", "model", "usage": {input, output, cacheRead,
        cacheWrite, totalTokens (tokens), cost{input, output, cacheRead, cacheWrite, total}
        (USD)}, "stopReason": "stop" | "length" | "toolUse" | "error", "timestamp" (Unix ms)}``.
        Thinking blocks keep their signature as ``thinkingSignature``.

        Only a stream that delivered ``message_stop`` is an answer: one that ends without it
        (cleanly, or by a dropped or reset connection, a tool_use input cut mid-way included)
        fails with ``details["reason"] == "stream_truncated"``, one silent for
        ``idle_timeout`` with ``"stream_idle_timeout"``; both retryable, and no
        :class:`Done` is yielded (the deltas and tool calls already yielded are no answer).

        Raises:
            ProviderError: ``retryable`` follows the one rule in
                :mod:`~durable_harness.providers.failures` (408, 409, 429, 5xx including 529,
                connection failures, timeouts, a cut stream, mid-stream overloaded/api
                errors: retryable); a missing key and unparseable tool arguments of a
                complete answer are not retryable. ``status`` holds the HTTP status when
                known.
        """
        return stream_closing(self._client, lambda client: self._stream(client, request))

    async def _stream(
        self, client: Any, request: ProviderRequest
    ) -> AsyncGenerator[ProviderEvent, None]:
        params = self.build_params(request)
        model = str(params["model"])
        blocks: dict[int, dict[str, Any]] = {}
        json_parts: dict[int, list[str]] = {}
        wire_usage: dict[str, int] = {}
        stop_reason: str | None = None
        try:
            stream = await client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise _map_error(exc, self.name, self._api_key) from None
        items = stream.__aiter__()
        received = 0
        stopped = False
        try:
            try:
                async for raw in items:
                    received += 1
                    event: dict[str, Any] = cast(Any, raw).model_dump()
                    etype = event.get("type")
                    if etype == "message_start":
                        message = event.get("message") or {}
                        model = str(message.get("model") or model)
                        _merge_usage(wire_usage, message.get("usage"))
                    elif etype == "content_block_start":
                        index = int(event.get("index") or 0)
                        block = _start_block(event.get("content_block") or {})
                        if block is not None:
                            blocks[index] = block
                            json_parts[index] = []
                    elif etype == "content_block_delta":
                        index = int(event.get("index") or 0)
                        delta = event.get("delta") or {}
                        out = _apply_delta(blocks.get(index), json_parts.get(index), delta)
                        if out is not None:
                            yield out
                    elif etype == "content_block_stop":
                        index = int(event.get("index") or 0)
                        block = blocks.get(index)
                        if block is not None and block["type"] == "toolCall":
                            block["arguments"] = parse_tool_arguments(
                                "".join(json_parts.get(index, [])),
                                name=block.get("name"),
                                call_id=block.get("id"),
                                provider=self.name,
                            )
                            yield ToolCallEvent(block["id"], block["name"], block["arguments"])
                    elif etype == "message_delta":
                        delta = event.get("delta") or {}
                        if delta.get("stop_reason"):
                            stop_reason = str(delta["stop_reason"])
                        _merge_usage(wire_usage, event.get("usage"))
                    elif etype == "message_stop":
                        stopped = True
            finally:
                with anyio.CancelScope(shield=True):
                    await close_stream(stream, items)
        except _BROKEN as exc:
            raise stream_broken(
                exc, self.name, self._api_key, received, self.read_timeout
            ) from None
        except anthropic.AnthropicError as exc:  # an error event inside the stream
            raise _map_error(exc, self.name, self._api_key) from None
        if not stopped:  # cut short: never an answer, whatever arrived
            raise stream_ended_early(self.name, "message_stop", received)

        content = [blocks[i] for i in sorted(blocks)]
        stop = _STOP_REASONS.get(stop_reason or "", "stop")
        if stop == "stop" and any(b["type"] == "toolCall" for b in content):
            stop = "toolUse"
        result: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "provider": self.name,
            "model": model,
            "usage": _usage(wire_usage, self.pricing),
            "stopReason": stop,
            "timestamp": int(time.time() * 1000),
        }
        if stop_reason == "refusal":
            result["errorMessage"] = "the model refused to answer"
        yield Done(result)


def _start_block(wire: Mapping[str, Any]) -> dict[str, Any] | None:
    """Our content block for a ``content_block_start`` (``None`` for server-side blocks)."""
    btype = wire.get("type")
    if btype == "text":
        return {"type": "text", "text": str(wire.get("text") or "")}
    if btype == "thinking":
        return {
            "type": "thinking",
            "thinking": str(wire.get("thinking") or ""),
            "thinkingSignature": str(wire.get("signature") or ""),
        }
    if btype == "redacted_thinking":
        return {
            "type": "thinking",
            "thinking": "",
            "thinkingSignature": str(wire.get("data")),
            "redacted": True,
        }
    if btype == "tool_use":
        return {
            "type": "toolCall",
            "id": str(wire.get("id") or ""),
            "name": str(wire.get("name") or ""),
            "arguments": {},
        }
    return None


def _apply_delta(
    block: dict[str, Any] | None, parts: list[str] | None, delta: Mapping[str, Any]
) -> ProviderEvent | None:
    """Fold a ``content_block_delta`` into its block; return the event to yield, if any."""
    if block is None:
        return None
    dtype = delta.get("type")
    if dtype == "text_delta" and block["type"] == "text":
        text = str(delta.get("text") or "")
        block["text"] += text
        return TextDelta(text) if text else None
    if dtype == "thinking_delta" and block["type"] == "thinking":
        text = str(delta.get("thinking") or "")
        block["thinking"] += text
        return ThinkingDelta(text) if text else None
    if dtype == "signature_delta" and block["type"] == "thinking":
        block["thinkingSignature"] += str(delta.get("signature") or "")
    elif dtype == "input_json_delta" and parts is not None:
        parts.append(str(delta.get("partial_json") or ""))
    return None


def _merge_usage(acc: dict[str, int], wire: Any) -> None:
    """Overwrite ``acc`` with the non-null token counts of a wire usage object."""
    if not isinstance(wire, Mapping):
        return
    for key in (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ):
        value = wire.get(key)
        if isinstance(value, int):
            acc[key] = value


def _usage(wire: Mapping[str, int], pricing: Mapping[str, float] | None) -> dict[str, Any]:
    """Map Messages API usage to pi's usage dict (tokens; cost in USD)."""
    usage = empty_usage()
    usage["input"] = wire.get("input_tokens", 0)
    usage["output"] = wire.get("output_tokens", 0)
    usage["cacheRead"] = wire.get("cache_read_input_tokens", 0)
    usage["cacheWrite"] = wire.get("cache_creation_input_tokens", 0)
    usage["totalTokens"] = (
        usage["input"] + usage["output"] + usage["cacheRead"] + usage["cacheWrite"]
    )
    return priced(usage, pricing)


def wire_tool_id(tool_call_id: str) -> str:
    """Reduce a tool-call id to what the API accepts: ``[A-Za-z0-9_-]``, 1 to 64 characters."""
    cleaned = _BAD_ID_CHARS.sub("_", tool_call_id)[:64]
    return cleaned or "toolu_empty"


def _image_block(block: Mapping[str, Any]) -> dict[str, Any]:
    """An image block, or a text note when the API would refuse the image."""
    checked = check_image(block, ANTHROPIC_IMAGES)
    if isinstance(checked, str):
        return {"type": "text", "text": checked}
    media_type, data = checked
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _thinking_allowed(messages: list[dict[str, Any]]) -> bool:
    """False when the request ends in an open tool-use turn (tool results answering the last
    assistant message) whose assistant message does not start with a thinking block: the API
    refuses extended thinking for such a request."""
    if len(messages) < 2 or messages[-1]["role"] != "user":
        return True
    last = messages[-1]["content"]
    if not (isinstance(last, list) and last and last[0].get("type") == "tool_result"):
        return True
    assistant = messages[-2]
    content = assistant["content"]
    if assistant["role"] != "assistant" or not isinstance(content, list) or not content:
        return True
    return content[0].get("type") in ("thinking", "redacted_thinking")


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Text (non-empty) and image blocks of a pi content list, in wire form."""
    out: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and block.get("text"):
            out.append({"type": "text", "text": str(block["text"])})
        elif block.get("type") == "image":
            out.append(_image_block(block))
    return out


def _assistant_blocks(content: Any, ids: WireIds, own: bool) -> list[dict[str, Any]]:
    """Wire blocks of one assistant message; ``own``: its thinking signatures were issued for
    the request's provider and model (else every thinking block is left out)."""
    out: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        btype = block.get("type")
        if btype == "text" and block.get("text"):
            out.append({"type": "text", "text": str(block["text"])})
        elif btype == "thinking":
            signature = block.get("thinkingSignature") or block.get("signature")
            if not signature or not own:
                continue
            if block.get("redacted"):
                out.append({"type": "redacted_thinking", "data": str(signature)})
            else:
                out.append(
                    {
                        "type": "thinking",
                        "thinking": str(block.get("thinking", "")),
                        "signature": str(signature),
                    }
                )
        elif btype == "toolCall":
            out.append(
                {
                    "type": "tool_use",
                    "id": ids.call(str(block.get("id", ""))),
                    "name": str(block.get("name", "")),
                    "input": block.get("arguments") or {},
                }
            )
    return out


def _tool_result(msg: Mapping[str, Any], ids: WireIds) -> dict[str, Any]:
    content = msg.get("content")
    if isinstance(content, str):
        wire_content: str | list[dict[str, Any]] = content
    else:
        parts = _blocks(content)
        if any(p["type"] == "image" for p in parts):
            wire_content = parts
        else:
            wire_content = "".join(p["text"] for p in parts)
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": ids.result(str(msg.get("toolCallId", ""))),
        "content": wire_content,
    }
    if msg.get("isError"):
        result["is_error"] = True
    return result


def to_anthropic_messages(
    messages: list[dict[str, Any]], *, provider: str = "anthropic", model: str | None = None
) -> list[dict[str, Any]]:
    """Convert context messages (pi shapes) to Messages API ``messages``.

    See the module docstring for the mapping. ``provider`` and ``model`` name the request's
    target: thinking signatures are re-sent only from assistant messages with that
    ``provider`` and ``model`` (``model=None``: any model of ``provider``). Assistant messages
    left with no blocks are dropped (the API rejects empty content); roles other than
    ``user``, ``assistant`` and ``toolResult`` are ignored.
    """
    out: list[dict[str, Any]] = []
    ids = WireIds(wire_tool_id, 64)
    results: list[dict[str, Any]] | None = None
    for msg in messages:
        role = msg.get("role")
        if role == "toolResult":
            if results is None:
                results = []
                out.append({"role": "user", "content": results})
            results.append(_tool_result(msg, ids))
            continue
        results = None
        if role == "user":
            content = msg.get("content", "")
            out.append(
                {
                    "role": "user",
                    "content": content if isinstance(content, str) else _blocks(content),
                }
            )
        elif role == "assistant":
            own = msg.get("provider") == provider and (model is None or msg.get("model") == model)
            blocks = _assistant_blocks(msg.get("content"), ids, own)
            if blocks:
                out.append({"role": "assistant", "content": blocks})
    return out


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Convert :class:`~durable_harness.providers.base.ToolSpec` items to API tool definitions."""
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]


def _map_error(exc: anthropic.AnthropicError, provider: str, secret: str | None) -> ProviderError:
    """Translate an ``anthropic`` SDK error into :class:`ProviderError` (message redacted)."""
    details: dict[str, Any] = {"provider": provider}
    status: int | None = None
    if isinstance(exc, anthropic.APITimeoutError):
        retryable, where, detail = True, "APITimeoutError", "request timed out"
    elif isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__
        retryable, where = True, "APIConnectionError"
        detail = f"connection error ({type(cause).__name__})" if cause else "connection error"
    elif isinstance(exc, anthropic.APIStatusError):
        etype, text = error_body(exc.body)
        if etype:
            details["error_type"] = etype
        request_id = getattr(exc, "request_id", None)
        if request_id:
            details["request_id"] = str(request_id)
        if exc.status_code >= 400:
            status = exc.status_code
            retryable = retryable_status(status, exc.response.headers)
            where = f"HTTP {status}"
            after = retry_after(exc.response)
            if after is not None:
                details["retry_after"] = after
        else:  # an error event inside a stream that began with HTTP 200
            retryable = retryable_error_type(etype)
            where = "error during streaming"
        detail = f"{etype}: {text}" if etype and text else etype or text
    elif isinstance(exc, anthropic.APIError):
        etype, text = error_body(exc.body)
        retryable, where = retryable_error_type(etype), "APIError"
        detail = text or exc.message
    else:
        retryable, where, detail = False, type(exc).__name__, str(exc)
    message = f"{provider}: {where}: {detail}" if detail else f"{provider}: {where}"
    return ProviderError(scrub(message, secret), retryable=retryable, status=status, **details)
