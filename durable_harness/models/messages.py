"""Message and content-block models, in the shapes of pi's session format (version 3). Every
model keeps unknown fields (a newer tool's round-trip). ``usage`` counts tokens; ``cost`` is in
USD; message ``timestamp`` is Unix milliseconds."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# the plain functions over content, here too for callers of the models' module
from durable_harness.models.content import text_of, tool_call_blocks, unique_tool_call_ids

__all__ = [
    "AssistantMessage",
    "BashExecutionMessage",
    "Cost",
    "CustomMessage",
    "ImageContent",
    "Message",
    "TextContent",
    "ThinkingContent",
    "ToolCall",
    "ToolResultMessage",
    "Usage",
    "UserMessage",
    "text_of",
    "tool_call_blocks",
    "unique_tool_call_ids",
]


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
