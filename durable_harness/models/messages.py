"""Message and content-block models, in the shapes of pi's session format (version 3). Every
model keeps unknown fields (a newer tool's round-trip). ``usage`` counts tokens; ``cost`` is in
USD; message ``timestamp`` is Unix milliseconds."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class TextContent(_Open):
    """``{"type": "text", "text": str}``."""

    type: Literal["text"] = "text"
    text: str


class ThinkingContent(_Open):
    """``{"type": "thinking", "thinking": str}``: model reasoning, kept but not re-sent as text."""

    type: Literal["thinking"] = "thinking"
    thinking: str


class ImageContent(_Open):
    """``{"type": "image", "data": base64 str, "mimeType": str}``."""

    type: Literal["image"] = "image"
    data: str
    mimeType: str


class ToolCall(_Open):
    """``{"type": "toolCall", "id", "name", "arguments": object}`` inside an assistant message."""

    type: Literal["toolCall"] = "toolCall"
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


ContentBlock = Annotated[
    TextContent | ThinkingContent | ImageContent | ToolCall, Field(discriminator="type")
]


class Cost(_Open):
    """Cost of one assistant message in USD, split as pi does."""

    input: float = 0.0
    output: float = 0.0
    cacheRead: float = 0.0
    cacheWrite: float = 0.0
    total: float = 0.0


class Usage(_Open):
    """Token counts of one provider response plus its :class:`Cost`."""

    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    totalTokens: int = 0
    cost: Cost | None = None
    """``None``: the cost is unknown (no price known for the model), never 0."""


class _Message(_Open):
    timestamp: int | None = None  # Unix milliseconds


StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]


class UserMessage(_Message):
    """A user prompt; ``content`` is a string or a list of text/image blocks."""

    role: Literal["user"] = "user"
    content: str | list[ContentBlock]


class AssistantMessage(_Message):
    """A provider answer: content blocks, usage, ``stopReason`` and the model that produced it."""

    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    usage: Usage = Field(default_factory=Usage)
    stopReason: StopReason = "stop"
    errorMessage: str | None = None


class ToolResultMessage(_Message):
    """The result of one tool call, tied to it by ``toolCallId``."""

    role: Literal["toolResult"] = "toolResult"
    toolCallId: str
    toolName: str
    content: list[ContentBlock] = Field(default_factory=list)
    isError: bool = False


class CustomMessage(_Message):
    """An extension's message (pi v3 ``custom`` role; ``hookMessage`` before v3)."""

    role: Literal["custom"] = "custom"
    customType: str = ""
    content: str | list[ContentBlock] = ""
    display: bool = True


class BashExecutionMessage(_Message):
    """A shell command the user ran by hand (pi's ``!command``), shown to the model as user text."""

    role: Literal["bashExecution"] = "bashExecution"
    command: str
    output: str = ""
    exitCode: int | None = None
    cancelled: bool = False
    truncated: bool = False


Message = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage | CustomMessage | BashExecutionMessage,
    Field(discriminator="role"),
]


def text_of(content: Any) -> str:
    """Return the concatenated text of a string or a list of content-block dicts."""
    if isinstance(content, str):
        return content
    parts = [
        b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
    ]
    return "".join(parts)


def tool_call_blocks(content: Any) -> list[dict[str, Any]]:
    """The ``toolCall`` blocks of a message's content (a list of block dicts; a string or
    ``None`` has none), in order."""
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


def unique_tool_call_ids(message: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Make the tool-call ids of one assistant message unique before it is stored.

    A repeated or empty id gets the first free ``<id>_<n>`` (``n`` from 2; ``call`` for an
    empty id), keeping to ``[A-Za-z0-9_-]``. Returns the message (a copy when something changed)
    and the renames ``[{"index", "from", "to"}]`` (``index`` among the message's tool calls).
    """
    content = message.get("content")
    if not isinstance(content, list):
        return message, []
    given = [b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]
    if all(given) and len(set(map(str, given))) == len(given):  # the common case
        return message, []
    taken = {str(cid) for cid in given if cid}
    seen: set[str] = set()
    renames: list[dict[str, Any]] = []
    out: list[Any] = []
    index = 0
    for block in content:
        if not (isinstance(block, dict) and block.get("type") == "toolCall"):
            out.append(block)
            continue
        original = block.get("id")
        cid = str(original) if original else ""
        if cid and cid not in seen:
            seen.add(cid)
            out.append(block)
        else:
            base, n = cid or "call", 2
            while f"{base}_{n}" in taken:
                n += 1
            new = f"{base}_{n}"
            taken.add(new)
            seen.add(new)
            renames.append({"index": index, "from": original, "to": new})
            out.append({**block, "id": new})
        index += 1
    if not renames:
        return message, []
    return {**message, "content": out}, renames
