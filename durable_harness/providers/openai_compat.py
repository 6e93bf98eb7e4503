"""OpenAI chat-completions provider (OpenAI itself and OpenAI-compatible servers).

Uses the official ``openai`` SDK: ``AsyncOpenAI(max_retries=0).chat.completions.create(
stream=True, stream_options={"include_usage": True})``. The SDK never retries: the harness does,
writing one ``provider_request_started`` record per attempt.

Wire mapping (pi message shapes -> chat completions):

* ``user``: a string stays a string; text/image blocks become ``{"type": "text"}`` /
  ``{"type": "image_url", "image_url": {"url": "data:<mime>;base64,<data>"}}`` parts. Images are
  checked against :data:`OPENAI_IMAGES` (PNG, JPEG, WEBP, GIF; 20 MB): one the API would refuse
  becomes a short text part instead (:func:`~durable_harness.providers._wire.check_image`).
* ``assistant``: text blocks are joined into ``content``; ``toolCall`` blocks become
  ``tool_calls`` with JSON-string ``arguments``. Thinking blocks are never sent, whoever made
  them: chat completions has no input field for earlier reasoning (OpenAI keeps a reasoning
  model's reasoning server-side, and compatible servers such as DeepSeek document that a
  ``reasoning_content`` field in input messages is an error), so no signature leaves either.
* Tool-call ids longer than :data:`MAX_TOOL_ID` are shortened (prefix + hash), the same on the
  call and its ``tool`` message; collisions get ``_2``...
* ``toolResult``: ``{"role": "tool", "tool_call_id", "content": text}``. Images in tool results
  (the tool role carries text only) follow the run of tool messages as one user message.
* The system prompt is the first ``{"role": "system"}`` message.

Stream mapping: ``content`` deltas -> :class:`TextDelta`; ``reasoning_content`` / ``reasoning``
deltas (sent by several compatible servers) -> :class:`ThinkingDelta`; tool-call deltas are
accumulated by ``index`` and each complete call is yielded once as a :class:`ToolCallEvent`
after the stream ends; then :class:`Done`. A stream without a ``finish_reason`` is cut short,
never an answer (:func:`~durable_harness.providers.failures.stream_ended_early`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import anyio
import openai

from durable_harness.errors import ProviderError
from durable_harness.providers import CREDENTIAL_ENV
from durable_harness.providers._wire import (
    OPENAI_IMAGES,
    WireIds,
    check_image,
    client_options,
    close_stream,
    parse_tool_arguments,
    setting,
    shorten_id,
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

__all__ = ["OPENAI_IMAGES", "OpenAIProvider", "to_openai_messages", "to_openai_tools"]

_BROKEN: tuple[type[BaseException], ...] = (openai.APIConnectionError, *TRANSPORT_ERRORS)
"""A stream's connection breaking after the HTTP 200 answer (the SDK's ``APIConnectionError``
and its ``APITimeoutError`` subclass, or the HTTP library's own error): ``stream_broken``."""

_KEY_ENV = CREDENTIAL_ENV["openai"]
"""The environment variable holding the API key when ``api_key`` is not given."""

_STOP_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "toolUse",
    "function_call": "toolUse",
    "content_filter": "error",
}
_REASONING_EFFORT = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}


class OpenAIProvider:
    """A :class:`~durable_harness.providers.base.Provider` over OpenAI chat completions.

    Args:
        model: default model id (a request's non-empty ``model`` overrides it).
        base_url: API root such as ``https://api.openai.com/v1``; falls back to the
            ``OPENAI_BASE_URL`` environment variable, then the SDK default.
        api_key: the API key; falls back to ``OPENAI_API_KEY``. Never appears in errors.
        context_window: the model's context window in tokens (default 128000).
        timeout: seconds allowed for each phase of a request: connecting, sending, waiting
            for a pooled connection, and each read (default 600).
        idle_timeout: seconds the server may stay silent while the request waits for its
            answer or its stream runs: each read of the connection, at most ``timeout``
            (keep-alives reset it). ``None`` takes ``DURABLE_HARNESS_STREAM_IDLE_TIMEOUT``,
            else 300 (the default of OpenAI Codex's ``stream_idle_timeout_ms``). Past it the
            attempt fails with reason ``stream_idle_timeout`` (retryable).
        pricing: USD per million tokens, keys ``input``, ``output``, ``cacheRead``,
            ``cacheWrite`` (missing keys cost 0); ``None`` leaves every cost at 0.
        reasoning: send ``reasoning_effort`` derived from the request's ``thinking_level``
            (only for reasoning models; ``off`` sends nothing).
        max_tokens_param: wire name of the output cap, ``max_completion_tokens`` (OpenAI) or
            ``max_tokens`` (older compatible servers).
        name: provider name written on assistant messages (default ``openai``).

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
        context_window: int = 128_000,
        timeout: float = 600.0,
        idle_timeout: float | None = None,
        pricing: Mapping[str, float] | None = None,
        reasoning: bool = False,
        max_tokens_param: str = "max_completion_tokens",
        name: str = "openai",
    ) -> None:
        self.name = name
        self.model = model
        self.context_window = context_window
        self.base_url = setting(base_url, "OPENAI_BASE_URL")
        self._api_key = setting(api_key, _KEY_ENV)
        self.timeout = timeout
        self.idle_timeout = idle_timeout_setting(idle_timeout)
        self.read_timeout = min(self.timeout, self.idle_timeout)
        self.pricing = dict(pricing) if pricing else None
        self.reasoning = reasoning
        self.max_tokens_param = max_tokens_param

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.model!r}, base_url={self.base_url!r})"

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
            timeout=openai.Timeout(self.timeout, read=self.read_timeout),
        )
        return openai.AsyncOpenAI(**options)

    def build_params(self, request: ProviderRequest) -> dict[str, Any]:
        """Return the keyword arguments of ``chat.completions.create`` for ``request``.

        Shape: ``{"model", "messages", "stream": True, "stream_options", ["tools"],
        [max_tokens_param], ["reasoning_effort"]}``.
        """
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": to_openai_messages(request.messages, request.system_prompt),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
        if request.max_tokens is not None:
            params[self.max_tokens_param] = request.max_tokens
        effort = _REASONING_EFFORT.get(request.thinking_level)
        if self.reasoning and effort:
            params["reasoning_effort"] = effort
        return params

    def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Stream the answer to ``request``: deltas, then tool calls, then one :class:`Done`.

        The ``Done`` message is ``{"role": "assistant", "content": [thinking?, text?,
        toolCall...], "provider", "model", "usage": {input, output, cacheRead, cacheWrite,
        totalTokens (tokens), cost{input, output, cacheRead, cacheWrite, total} (USD)},
        "stopReason": "stop" | "length" | "toolUse" | "error", "timestamp" (Unix ms)}``.

        Only a stream that delivered its ``finish_reason`` is an answer: one that ends
        without it (cleanly, or by a dropped or reset connection, a tool call's arguments cut
        mid-way included) fails with ``details["reason"] == "stream_truncated"``, one silent
        for ``idle_timeout`` with ``"stream_idle_timeout"``; both retryable, and no
        :class:`Done` is yielded (the deltas already yielded are no answer).

        Raises:
            ProviderError: ``retryable`` follows the one rule in
                :mod:`~durable_harness.providers.failures` (408, 409, 429, 5xx, connection
                failures, timeouts, a cut stream, mid-stream server errors: retryable); a
                missing key and unparseable tool arguments of a complete answer are not
                retryable. ``status`` holds the HTTP status when known.
        """
        return stream_closing(self._client, lambda client: self._stream(client, request))

    async def _stream(
        self, client: Any, request: ProviderRequest
    ) -> AsyncGenerator[ProviderEvent, None]:
        params = self.build_params(request)
        model = str(params["model"])
        text_parts: list[str] = []
        thinking_parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish_reason: str | None = None
        wire_usage: dict[str, Any] | None = None
        try:
            stream = await client.chat.completions.create(**params)
        except openai.OpenAIError as exc:
            raise _map_error(exc, self.name, self._api_key) from None
        items = stream.__aiter__()
        received = 0
        try:
            try:
                async for chunk in items:
                    received += 1
                    data: dict[str, Any] = cast(Any, chunk).model_dump()
                    if data.get("model"):
                        model = str(data["model"])
                    if data.get("usage"):
                        wire_usage = data["usage"]
                    for choice in data.get("choices") or []:
                        if choice.get("index", 0) != 0:
                            continue
                        delta = choice.get("delta") or {}
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                        if isinstance(reasoning, str) and reasoning:
                            thinking_parts.append(reasoning)
                            yield ThinkingDelta(reasoning)
                        content = delta.get("content")
                        if content:
                            text_parts.append(content)
                            yield TextDelta(content)
                        for tc in delta.get("tool_calls") or []:
                            _merge_tool_call(calls, tc)
                        if choice.get("finish_reason"):
                            finish_reason = str(choice["finish_reason"])
            finally:
                with anyio.CancelScope(shield=True):
                    await close_stream(stream, items)
        except _BROKEN as exc:
            raise stream_broken(
                exc, self.name, self._api_key, received, self.read_timeout
            ) from None
        except openai.OpenAIError as exc:  # an error event inside the stream
            raise _map_error(exc, self.name, self._api_key) from None
        if finish_reason is None:  # cut short: never an answer, whatever arrived
            raise stream_ended_early(self.name, "a finish_reason", received)

        blocks: list[dict[str, Any]] = []
        thinking = "".join(thinking_parts)
        if thinking:
            blocks.append({"type": "thinking", "thinking": thinking})
        text = "".join(text_parts)
        if text:
            blocks.append({"type": "text", "text": text})
        tool_blocks = [
            {
                "type": "toolCall",
                "id": calls[i]["id"] or f"call_{uuid.uuid4().hex[:24]}",
                "name": calls[i]["name"],
                "arguments": parse_tool_arguments(
                    str(calls[i]["arguments"]),
                    name=calls[i]["name"],
                    call_id=calls[i]["id"],
                    provider=self.name,
                ),
            }
            for i in sorted(calls)
        ]
        for block in tool_blocks:
            blocks.append(block)
            yield ToolCallEvent(block["id"], block["name"], block["arguments"])

        stop = _STOP_REASONS.get(finish_reason or "", "stop")
        if calls and stop == "stop":
            stop = "toolUse"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": blocks,
            "provider": self.name,
            "model": model,
            "usage": _usage(wire_usage, self.pricing),
            "stopReason": stop,
            "timestamp": int(time.time() * 1000),
        }
        if finish_reason == "content_filter":
            message["errorMessage"] = "the response was withheld by the content filter"
        yield Done(message)


def _merge_tool_call(calls: dict[int, dict[str, Any]], tc: Mapping[str, Any]) -> None:
    """Fold one streamed tool-call delta into ``calls`` (keyed by the delta's ``index``)."""
    index = int(tc.get("index") or 0)
    call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    if tc.get("id"):
        call["id"] = str(tc["id"])
    function = tc.get("function") or {}
    if function.get("name") and not call["name"]:
        call["name"] = str(function["name"])
    if function.get("arguments"):
        call["arguments"] += str(function["arguments"])


def _usage(wire: Mapping[str, Any] | None, pricing: Mapping[str, float] | None) -> dict[str, Any]:
    """Map chat-completions usage to pi's usage dict; ``input`` excludes cached tokens."""
    usage = empty_usage()
    if not wire:
        return usage
    details = wire.get("prompt_tokens_details") or {}
    cache_read = int(details.get("cached_tokens") or 0)
    cache_write = int(details.get("cache_write_tokens") or 0)
    prompt = int(wire.get("prompt_tokens") or 0)
    usage["input"] = max(prompt - cache_read - cache_write, 0)
    usage["output"] = int(wire.get("completion_tokens") or 0)
    usage["cacheRead"] = cache_read
    usage["cacheWrite"] = cache_write
    usage["totalTokens"] = usage["input"] + usage["output"] + cache_read + cache_write
    return priced(usage, pricing)


MAX_TOOL_ID = 40
"""OpenAI refuses a ``tool_calls[].id`` longer than 40 characters (pi's Responses-API ids,
``call_...|fc_...``, are longer); longer ids are shortened stably."""


def _wire_id(call_id: str) -> str:
    return shorten_id(call_id, MAX_TOOL_ID)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        str(b.get("text", ""))
        for b in content or []
        if isinstance(b, dict) and b.get("type") == "text"
    )


def _images(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return []
    return [b for b in content or [] if isinstance(b, dict) and b.get("type") == "image"]


def _image_part(block: Mapping[str, Any]) -> dict[str, Any]:
    """An ``image_url`` part with a data URL, or a text part when the API would refuse it."""
    checked = check_image(block, OPENAI_IMAGES)
    if isinstance(checked, str):
        return {"type": "text", "text": checked}
    mime, data = checked
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif block.get("type") == "image":
            parts.append(_image_part(block))
    return parts


def to_openai_messages(
    messages: list[dict[str, Any]], system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """Convert context messages (pi shapes) to chat-completions ``messages``.

    See the module docstring for the mapping. Assistant messages with neither text nor tool
    calls are left out (the API rejects them); roles other than ``user``, ``assistant`` and
    ``toolResult`` are ignored.
    """
    out: list[dict[str, Any]] = []
    ids = WireIds(_wire_id, MAX_TOOL_ID)
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    pending_images: list[dict[str, Any]] = []

    def flush_images() -> None:
        if pending_images:
            out.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Images returned by the tool calls above:"},
                        *(_image_part(b) for b in pending_images),
                    ],
                }
            )
            pending_images.clear()

    for msg in messages:
        role = msg.get("role")
        if role != "toolResult":
            flush_images()
        if role == "user":
            out.append({"role": "user", "content": _user_content(msg.get("content", ""))})
        elif role == "assistant":
            blocks = [b for b in msg.get("content") or [] if isinstance(b, dict)]
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            tool_calls = [
                {
                    "id": ids.call(str(b.get("id", ""))),
                    "type": "function",
                    "function": {
                        "name": str(b.get("name", "")),
                        "arguments": json.dumps(b.get("arguments") or {}),
                    },
                }
                for b in blocks
                if b.get("type") == "toolCall"
            ]
            if not text and not tool_calls:
                continue
            wire: dict[str, Any] = {"role": "assistant", "content": text or None}
            if tool_calls:
                wire["tool_calls"] = tool_calls
            out.append(wire)
        elif role == "toolResult":
            content = msg.get("content")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": ids.result(str(msg.get("toolCallId", ""))),
                    "content": _text(content),
                }
            )
            pending_images.extend(_images(content))
    flush_images()
    return out


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Convert :class:`~durable_harness.providers.base.ToolSpec` items to function tools."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


@dataclass(frozen=True)
class _ErrorInfo:
    status: int | None
    retryable: bool
    detail: str


def _map_error(exc: openai.OpenAIError, provider: str, secret: str | None) -> ProviderError:
    """Translate an ``openai`` SDK error into :class:`ProviderError` (message redacted)."""
    details: dict[str, Any] = {"provider": provider}
    if isinstance(exc, openai.APITimeoutError):
        info = _ErrorInfo(None, True, "request timed out")
    elif isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        info = _ErrorInfo(
            None,
            True,
            f"connection error ({type(cause).__name__})" if cause else "connection error",
        )
    elif isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = retryable_status(status, exc.response.headers)
        info = _ErrorInfo(status, retryable, error_body(exc.body)[1])
        after = retry_after(exc.response)
        if after is not None:
            details["retry_after"] = after
        if exc.request_id:
            details["request_id"] = exc.request_id
    elif isinstance(exc, openai.APIError):  # an error event inside a 200 stream
        etype, text = error_body(exc.body)
        if etype:
            details["error_type"] = etype
        info = _ErrorInfo(
            None, retryable_error_type(etype), f"error during streaming: {text or exc.message}"
        )
    else:
        info = _ErrorInfo(None, False, f"{type(exc).__name__}: {exc}")
    where = f"HTTP {info.status}" if info.status is not None else type(exc).__name__
    message = f"{provider}: {where}: {info.detail}" if info.detail else f"{provider}: {where}"
    return ProviderError(
        scrub(message, secret), retryable=info.retryable, status=info.status, **details
    )
