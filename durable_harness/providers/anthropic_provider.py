"""Anthropic Messages API provider: ``AsyncAnthropic.messages.create(stream=True)``, the raw
server-sent events read (the shared skeleton: :class:`~durable_harness.providers._wire.
NetworkProvider`).

Wire mapping (pi message shapes -> Messages API):

* The system prompt goes to the top-level ``system`` field.
* ``user``: a string stays a string; text/image blocks become ``{"type": "text"}`` /
  ``{"type": "image", "source": {"type": "base64", "media_type", "data"}}`` blocks.
* ``assistant``: text blocks (non-empty) stay text; ``toolCall`` blocks become ``tool_use`` with
  ``input=arguments``. A ``thinking`` block is re-sent only when its signature
  (``thinkingSignature``, pi's field, or ``signature``) was issued for this provider and model:
  the message's ``provider`` and ``model`` are the request's. Then it goes out as ``thinking``
  (or ``redacted_thinking`` when marked ``redacted``), unmodified, as the extended-thinking
  guide requires; unsigned own thinking is left out. Another provider's or model's thinking
  goes out as a ``text`` block (its signature would fail Anthropic's check), redacted or empty
  thinking, or thinking of a message naming no provider or model, not at all: what pi sends
  (``design/context.md``, "pi sessions").
  With thinking enabled, a request whose open tool-use turn (the
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
:class:`ToolCallEvent` at ``content_block_stop``, then :class:`Done` (once ``message_stop``
arrived: :mod:`~durable_harness.providers.failures`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Unpack

import anthropic

from durable_harness.providers._wire import (
    ImageLimits,
    NetworkProvider,
    Settings,
    WireIds,
    WireStream,
    check_image,
)
from durable_harness.providers.base import (
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    foreign_thinking_text,
)

ANTHROPIC_IMAGES = ImageLimits(
    "anthropic", ("image/jpeg", "image/png", "image/gif", "image/webp"), 5 * 1024 * 1024
)
"""Anthropic Messages (vision guide): JPEG, PNG, GIF, WebP; 5 MB per image on the API."""

_THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class _AnthropicStream(WireStream):
    """The Messages API's server-sent events folded: blocks by index, their streamed tool
    arguments, the usage counts; ``message_stop`` ends it."""

    end_marker = "message_stop"
    stop_reasons: ClassVar[Mapping[str, str]] = {
        "end_turn": "stop",
        "stop_sequence": "stop",
        "pause_turn": "stop",
        "max_tokens": "length",
        "model_context_window_exceeded": "length",
        "tool_use": "toolUse",
        "refusal": "error",
    }
    stop_errors: ClassVar[Mapping[str, str]] = {"refusal": "the model refused to answer"}

    def __init__(self, provider: str, model: str) -> None:
        super().__init__(provider, model)
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json_parts: dict[int, list[str]] = {}
        # the streamed text, thinking and signature of each open block, joined when it stops
        # (a string grown by += per delta copies the whole answer at every delta)
        self.text_parts: dict[int, dict[str, list[str]]] = {}
        self.wire_usage: dict[str, int] = {}

    def feed(self, event: dict[str, Any]) -> Iterator[ProviderEvent]:
        etype = event.get("type")
        index = int(event.get("index") or 0)
        if etype == "message_start":
            message = event.get("message") or {}
            self.model = str(message.get("model") or self.model)
            _merge_usage(self.wire_usage, message.get("usage"))
        elif etype == "content_block_start":
            block = _start_block(event.get("content_block") or {})
            if block is not None:
                self.blocks[index] = block
                self.json_parts[index] = []
                self.text_parts[index] = {}
        elif etype == "content_block_delta":
            out = _apply_delta(
                self.blocks.get(index),
                self.json_parts.get(index),
                self.text_parts.get(index),
                event.get("delta") or {},
            )
            if out is not None:
                yield out
        elif etype == "content_block_stop":
            self._join(index)
            block = self.blocks.get(index)
            if block is not None and block["type"] == "toolCall":
                raw = "".join(self.json_parts.get(index, []))
                block["arguments"] = self.arguments(raw, block.get("name"), block.get("id"))
                yield ToolCallEvent(block["id"], block["name"], block["arguments"])
        elif etype == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop = str(delta["stop_reason"])
            _merge_usage(self.wire_usage, event.get("usage"))
        elif etype == "message_stop":
            self.ended = True
            for i in list(self.text_parts):  # a block the stream never stopped
                self._join(i)
            self.content = [self.blocks[i] for i in sorted(self.blocks)]

    def _join(self, index: int) -> None:
        """Append the streamed pieces of block ``index`` to its fields, once."""
        pieces = self.text_parts.pop(index, {})
        block = self.blocks.get(index)
        if block is not None:
            for field, parts in pieces.items():
                block[field] += "".join(parts)

    def usage(self, pricing: Mapping[str, float] | None) -> dict[str, Any]:
        """Map Messages API usage to pi's usage dict (tokens; cost in USD)."""
        wire = self.wire_usage
        return self.tokens(
            pricing,
            wire.get("cache_read_input_tokens", 0),
            wire.get("cache_creation_input_tokens", 0),
            input=wire.get("input_tokens", 0),
            output=wire.get("output_tokens", 0),
        )


class AnthropicProvider(NetworkProvider):
    """A :class:`~durable_harness.providers._wire.NetworkProvider` over the Anthropic Messages
    API (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``; ``ping`` events reset the idle timeout).

    Args: ``model``; ``max_tokens``, the output cap when the request sets none (default 4096);
    :class:`~durable_harness.providers._wire.Settings` (``context_window`` default 200000);
    ``reasoning`` enables extended thinking from the request's ``thinking_level`` (budget
    1024/2048/8192/16384 tokens for minimal/low/medium/high, added to ``max_tokens``).
    """

    family = "anthropic"
    default_window = 200_000
    sdk: ClassVar[Any] = anthropic
    sdk_error = anthropic.AnthropicError
    client_class: ClassVar[Any] = anthropic.AsyncAnthropic
    wire = _AnthropicStream

    def __init__(self, model: str, *, max_tokens: int = 4096, **settings: Unpack[Settings]) -> None:
        super().__init__(model, **settings)
        self.max_tokens = max_tokens

    async def _create(self, client: Any, params: dict[str, Any]) -> Any:
        return await client.messages.create(**params)

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
    block: dict[str, Any] | None,
    parts: list[str] | None,
    texts: dict[str, list[str]] | None,
    delta: Mapping[str, Any],
) -> ProviderEvent | None:
    """Fold a ``content_block_delta`` into its block's pieces (``parts``: the tool input's JSON;
    ``texts``: the pieces of its text fields, by field); return the event to yield, if any."""
    if block is None or texts is None:
        return None
    dtype = delta.get("type")
    if dtype == "text_delta" and block["type"] == "text":
        text = str(delta.get("text") or "")
        texts.setdefault("text", []).append(text)
        return TextDelta(text) if text else None
    if dtype == "thinking_delta" and block["type"] == "thinking":
        text = str(delta.get("thinking") or "")
        texts.setdefault("thinking", []).append(text)
        return ThinkingDelta(text) if text else None
    if dtype == "signature_delta" and block["type"] == "thinking":
        texts.setdefault("thinkingSignature", []).append(str(delta.get("signature") or ""))
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


def _assistant_blocks(
    content: Any, ids: WireIds, own: bool, foreign: bool = False
) -> list[dict[str, Any]]:
    """Wire blocks of one assistant message; ``own``: its thinking signatures were issued for
    the request's provider and model; ``foreign``: the message names another provider or model,
    whose thinking goes as text (:func:`~durable_harness.providers.base.foreign_thinking_text`);
    thinking of a message naming neither is left out."""
    out: list[dict[str, Any]] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        btype = block.get("type")
        if btype == "text" and block.get("text"):
            out.append({"type": "text", "text": str(block["text"])})
        elif btype == "thinking":
            signature = block.get("thinkingSignature") or block.get("signature")
            if foreign:  # another model's reasoning, inlined as text as pi does
                text = foreign_thinking_text(block)
                if text:
                    out.append({"type": "text", "text": text})
                continue
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
            named = msg.get("provider") is not None or msg.get("model") is not None
            blocks = _assistant_blocks(msg.get("content"), ids, own, foreign=named and not own)
            if blocks:
                out.append({"role": "assistant", "content": blocks})
    return out


def to_anthropic_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Convert :class:`~durable_harness.providers.base.ToolSpec` items to API tool definitions."""
    return [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
    ]
