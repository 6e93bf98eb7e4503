"""OpenAI chat-completions provider (OpenAI itself and OpenAI-compatible servers):
``AsyncOpenAI.chat.completions.create(stream=True, stream_options={"include_usage": True})``
(the shared skeleton: :class:`~durable_harness.providers._wire.NetworkProvider`).

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
after the stream ends; then :class:`Done` (once a ``finish_reason`` arrived:
:mod:`~durable_harness.providers.failures`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Unpack

import openai

from durable_harness.providers._wire import (
    ImageLimits,
    NetworkProvider,
    Settings,
    WireIds,
    WireStream,
    check_image,
    shorten_id,
)
from durable_harness.providers.base import (
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    arguments_json,
    empty_usage,
    foreign_thinking_text,
)

OPENAI_IMAGES = ImageLimits(
    "openai", ("image/jpeg", "image/png", "image/gif", "image/webp"), 20 * 1024 * 1024
)
"""OpenAI chat completions (images guide): PNG, JPEG, WEBP, non-animated GIF; 20 MB per image."""

_REASONING_EFFORT = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}


class _OpenAIStream(WireStream):
    """Chat-completion chunks folded (choice 0 only): text, reasoning, tool calls by index,
    the usage chunk; a ``finish_reason`` ends it. Each tool call is yielded once the stream
    ended, with its arguments parsed."""

    end_marker = "a finish_reason"
    stop_reasons: ClassVar[Mapping[str, str]] = {
        "stop": "stop",
        "length": "length",
        "tool_calls": "toolUse",
        "function_call": "toolUse",
        "content_filter": "error",
    }
    stop_errors: ClassVar[Mapping[str, str]] = {
        "content_filter": "the response was withheld by the content filter"
    }

    def __init__(self, provider: str, model: str) -> None:
        super().__init__(provider, model)
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.wire_usage: dict[str, Any] | None = None

    def feed(self, event: dict[str, Any]) -> Iterator[ProviderEvent]:
        if event.get("model"):
            self.model = str(event["model"])
        if event.get("usage"):
            self.wire_usage = event["usage"]
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self.thinking.append(reasoning)
                yield ThinkingDelta(reasoning)
            content = delta.get("content")
            if content:
                self.text.append(content)
                yield TextDelta(content)
            for tc in delta.get("tool_calls") or []:
                _merge_tool_call(self.calls, tc)
            if choice.get("finish_reason"):
                self.stop = str(choice["finish_reason"])
                self.ended = True

    def finish(self) -> Iterator[ProviderEvent]:
        thinking, text = "".join(self.thinking), "".join(self.text)
        if thinking:
            self.content.append({"type": "thinking", "thinking": thinking})
        if text:
            self.content.append({"type": "text", "text": text})
        for i in sorted(self.calls):
            call = self.calls[i]
            block = {
                "type": "toolCall",
                "id": call["id"] or f"call_{uuid.uuid4().hex[:24]}",
                "name": call["name"],
                "arguments": self.arguments("".join(call["arguments"]), call["name"], call["id"]),
            }
            self.content.append(block)
            yield ToolCallEvent(block["id"], block["name"], block["arguments"])

    def usage(self, pricing: Mapping[str, float] | None) -> dict[str, Any]:
        """Map chat-completions usage to pi's usage dict; ``input`` excludes cached tokens
        (no usage chunk: zero tokens, cost unknown)."""
        wire = self.wire_usage
        if not wire:
            return empty_usage()
        details = wire.get("prompt_tokens_details") or {}
        read = int(details.get("cached_tokens") or 0)
        write = int(details.get("cache_write_tokens") or 0)
        prompt = int(wire.get("prompt_tokens") or 0)
        return self.tokens(
            pricing,
            read,
            write,
            input=max(prompt - read - write, 0),
            output=int(wire.get("completion_tokens") or 0),
        )


class OpenAIProvider(NetworkProvider):
    """A :class:`~durable_harness.providers._wire.NetworkProvider` over OpenAI chat
    completions (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``).

    Args: ``model``; ``max_tokens_param``, the wire name of the output cap
    (``max_completion_tokens``, OpenAI's, or ``max_tokens`` for older compatible servers);
    :class:`~durable_harness.providers._wire.Settings` (``context_window`` default 128000);
    ``reasoning`` sends ``reasoning_effort`` from the request's ``thinking_level`` (for
    reasoning models; ``off`` sends nothing).
    """

    family = "openai"
    default_window = 128_000
    sdk: ClassVar[Any] = openai
    sdk_error = openai.OpenAIError
    client_class: ClassVar[Any] = openai.AsyncOpenAI
    wire = _OpenAIStream

    def __init__(
        self,
        model: str,
        *,
        max_tokens_param: str = "max_completion_tokens",
        **settings: Unpack[Settings],
    ) -> None:
        super().__init__(model, **settings)
        self.max_tokens_param = max_tokens_param

    async def _create(self, client: Any, params: dict[str, Any]) -> Any:
        return await client.chat.completions.create(**params)

    def build_params(self, request: ProviderRequest) -> dict[str, Any]:
        """Return the keyword arguments of ``chat.completions.create`` for ``request``.

        Shape: ``{"model", "messages", "stream": True, "stream_options", ["tools"],
        [max_tokens_param], ["reasoning_effort"]}``.
        """
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": to_openai_messages(
                request.messages,
                request.system_prompt,
                provider=self.name,
                model=request.model or self.model,
            ),
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


def _merge_tool_call(calls: dict[int, dict[str, Any]], tc: Mapping[str, Any]) -> None:
    """Fold one streamed tool-call delta into ``calls`` (keyed by the delta's ``index``)."""
    index = int(tc.get("index") or 0)
    call = calls.setdefault(index, {"id": "", "name": "", "arguments": []})
    if tc.get("id"):
        call["id"] = str(tc["id"])
    function = tc.get("function") or {}
    if function.get("name") and not call["name"]:
        call["name"] = str(function["name"])
    if function.get("arguments"):
        call["arguments"].append(str(function["arguments"]))  # joined once, in finish()


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
    messages: list[dict[str, Any]],
    system_prompt: str | None = None,
    *,
    provider: str | None = None,
    model: str | None = None,
) -> list[dict[str, Any]]:
    """Convert context messages (pi shapes) to chat-completions ``messages``.

    ``provider`` and ``model`` name the request's target (``model=None``: any model of
    ``provider``): an assistant message by another provider or model has its thinking inlined
    as text, in block order
    (:func:`~durable_harness.providers.base.foreign_thinking_text`); the target's own thinking is
    not re-sent. Tool-call arguments are compact JSON (:func:`arguments_json`), as pi sends them.

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
            named = msg.get("provider") is not None or msg.get("model") is not None
            own = msg.get("provider") == provider and (model is None or msg.get("model") == model)
            foreign = provider is not None and named and not own
            text = "".join(
                str(b.get("text", ""))
                if b.get("type") == "text"
                else (foreign_thinking_text(b) if foreign else "")
                for b in blocks
                if b.get("type") in ("text", "thinking")
            )
            tool_calls = [
                {
                    "id": ids.call(str(b.get("id", ""))),
                    "type": "function",
                    "function": {
                        "name": str(b.get("name", "")),
                        "arguments": arguments_json(b.get("arguments")),
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
