"""Realistic session content for the benchmarks: message entries, compactions, the echo tool.

Entries have the shapes the harness writes (``type="message"`` with a user, assistant or
``toolResult`` message in pi's format), with deterministic filler text so runs are comparable.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_harness.ids import now_iso, now_ms
from durable_harness.tools.base import Replay, Tool, ToolContext, ToolResult

_TEXT = (
    "the parser returns a list of tokens and the test expects the trailing comment to be kept "
    "so we read the module first then patch the loop that drops it and run the suite again "
    "while checking that the fixture files still match the recorded output of each case"
)
_WORDS = _TEXT.split(" ")

MODEL = {"provider": "scripted", "modelId": "scripted-1"}


def filler(length: int, seed: int) -> str:
    """Deterministic English-looking text of exactly ``length`` characters."""
    words: list[str] = []
    size = 0
    i = seed
    while size < length:
        w = _WORDS[i % len(_WORDS)]
        words.append(w)
        size += len(w) + 1
        i += 7
    return " ".join(words)[:length]


def _usage(i: int) -> dict[str, Any]:
    return {
        "input": 1200 + i % 700,
        "output": 60 + i % 90,
        "cacheRead": 0,
        "cacheWrite": 0,
        "totalTokens": 1260 + i % 790,
        "cost": {
            "input": 0.0036,
            "output": 0.0009,
            "cacheRead": 0.0,
            "cacheWrite": 0.0,
            "total": 0.0045,
        },
    }


def user_message(i: int, text_len: int = 160) -> dict[str, Any]:
    """A user prompt."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": filler(text_len, i)}],
        "timestamp": now_ms(),
    }


def assistant_message(i: int, text_len: int = 120) -> dict[str, Any]:
    """An assistant answer with some text and one ``read_file`` tool call."""
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "text": filler(text_len, i)},
            {
                "type": "toolCall",
                "id": f"call_{i}_1",
                "name": "read_file",
                "arguments": {"path": f"src/pkg/module_{i % 97}.py"},
            },
        ],
        "provider": "scripted",
        "model": "scripted-1",
        "usage": _usage(i),
        "stopReason": "toolUse",
        "timestamp": now_ms(),
    }


def tool_result_message(i: int, text_len: int = 380) -> dict[str, Any]:
    """The result of the previous assistant message's tool call."""
    return {
        "role": "toolResult",
        "toolCallId": f"call_{max(i - 1, 0)}_1",
        "toolName": "read_file",
        "content": [{"type": "text", "text": filler(text_len, i)}],
        "isError": False,
        "timestamp": now_ms(),
    }


def message_entry(
    message: dict[str, Any], parent_id: str | None, entry_id: str | None = None
) -> dict[str, Any]:
    """Wrap ``message`` in a ``message`` entry under ``parent_id``."""
    return {
        "type": "message",
        "id": entry_id or os.urandom(8).hex(),
        "parentId": parent_id,
        "timestamp": now_iso(),
        "message": message,
    }


def commit_entry(i: int, parent_id: str | None) -> dict[str, Any]:
    """The entry of one typical single-entry commit (a short tool result): its JSONL commit
    line is about 440 bytes."""
    return message_entry(tool_result_message(i, text_len=100), parent_id)


def compaction_entry(i: int, parent_id: str | None, first_kept: str | None) -> dict[str, Any]:
    """A compaction entry with a ``settings`` snapshot, so a context walk stops at its cut."""
    return {
        "type": "compaction",
        "id": os.urandom(8).hex(),
        "parentId": parent_id,
        "timestamp": now_iso(),
        "summary": filler(420, i),
        "firstKeptEntryId": first_kept,
        "tokensBefore": 48_000 + i % 5000,
        "settings": {"model": dict(MODEL), "thinkingLevel": "off"},
    }


def long_session_entries(
    n: int, *, compact_every: int = 500, user_every: int = 10, keep_back: int = 20
) -> list[dict[str, Any]]:
    """``n`` chained entries (~600-byte JSONL lines): a user prompt every ``user_every``
    entries, assistant/tool-result pairs between, and every ``compact_every`` entries a
    compaction keeping about the last ``keep_back`` entries (from a user message)."""
    out: list[dict[str, Any]] = []
    parent: str | None = None
    users: list[tuple[int, str]] = []
    for i in range(n):
        if i % compact_every == compact_every // 2 - 1:
            kept = next(
                (eid for idx, eid in reversed(users) if idx <= i - keep_back),
                users[0][1] if users else None,
            )
            entry = compaction_entry(i, parent, kept)
        elif i % user_every == 0:
            entry = message_entry(user_message(i, 300), parent)
            users.append((i, entry["id"]))
            users = users[-8:]
        elif i % 2 == 1:
            entry = message_entry(assistant_message(i, 40), parent)
        else:
            entry = message_entry(tool_result_message(i, 250), parent)
        out.append(entry)
        parent = entry["id"]
    return out


class EchoArgs(BaseModel):
    """Arguments of :class:`EchoTool`."""

    text: str = ""


class EchoTool(Tool):
    """A trivial tool: returns its ``text`` argument. Running it twice is harmless."""

    name: ClassVar[str] = "echo"
    description: ClassVar[str] = "Return the given text unchanged."
    Args: ClassVar[type[BaseModel]] = EchoArgs
    replay: ClassVar[Replay] = "safe"

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult.text(args.text)
