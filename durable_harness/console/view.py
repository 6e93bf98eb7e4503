"""What the console's pages show of a session's transcript (``design/console.md``): pure
functions over its entries, which the host's read model reads.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_harness.harness.report import format_cost, message_cost
from durable_harness.host.read_model import parse_ts

MAX_TEXT = 20_000
"""Longest text shown for one block (characters); the rest is cut with a note."""


@dataclass
class ToolCallView:
    """A tool call in the transcript with its result (``pending`` while it has none)."""

    id: str
    name: str
    arguments: str
    result: str | None = None
    is_error: bool = False

    @property
    def pending(self) -> bool:
        """Whether no result entry answers the call yet."""
        return self.result is None


@dataclass
class Item:
    """One transcript item: ``kind`` is ``user``, ``assistant``, ``branch``, ``compaction``,
    ``note`` (other entries: model changes, labels...) or ``tool`` (a result not paired with
    a call on the path)."""

    kind: str
    id: str
    timestamp: str
    text: str = ""
    thinking: str = ""
    calls: list[ToolCallView] = field(default_factory=list)
    branches: int = 0
    meta: str = ""


def ago(timestamp: str | None, now: float | None = None) -> str:
    """``timestamp`` as a short age (``12 s ago``), or ``never``."""
    t = parse_ts(timestamp)
    if t is None:
        return "never"
    delta = max(0.0, (now if now is not None else time.time()) - t)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if delta >= size:
            return f"{delta // size:.0f} {unit} ago"
    return f"{delta:.0f} s ago"


def _text(content: Any, kind: str = "text") -> str:
    if isinstance(content, str):
        return content if kind == "text" else ""
    out: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == kind:
            out.append(str(block.get(kind) or block.get("text") or ""))
        elif isinstance(block, dict) and block.get("type") == "image" and kind == "text":
            out.append("[image]")
    return _cut("\n".join(out))


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n… ({len(text) - MAX_TEXT} more characters)"


def transcript(
    path: list[dict[str, Any]], all_entries: Iterable[Mapping[str, Any]] = ()
) -> list[Item]:
    """The items of a lane's path (root to leaf): messages, each tool call with its result,
    branch summaries and compactions as markers; an entry with more than one child in
    ``all_entries`` is a branch point (``branches``)."""
    children = Counter(str(e.get("parentId")) for e in all_entries if e.get("parentId"))
    results: dict[str, dict[str, Any]] = {}
    for entry in path:
        message = entry.get("message") or {}
        if entry.get("type") == "message" and message.get("role") == "toolResult":
            results[str(message.get("toolCallId"))] = message
    called: set[str] = set()
    items: list[Item] = []
    for entry in path:
        etype = str(entry.get("type"))
        eid = str(entry.get("id"))
        ts = str(entry.get("timestamp") or "")
        branches = children.get(eid, 0)
        message = entry.get("message") or {}
        role = message.get("role") if etype == "message" else None
        if role == "user":
            items.append(Item("user", eid, ts, _text(message.get("content")), branches=branches))
        elif role == "assistant":
            item = Item(
                "assistant",
                eid,
                ts,
                _text(message.get("content")),
                thinking=_text(message.get("content"), "thinking"),
                branches=branches,
                meta=_assistant_meta(message),
            )
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    cid = str(block.get("id"))
                    called.add(cid)
                    result = results.get(cid)
                    item.calls.append(
                        ToolCallView(
                            cid,
                            str(block.get("name")),
                            _cut(json.dumps(block.get("arguments"), indent=2, ensure_ascii=False)),
                            _text(result.get("content")) if result is not None else None,
                            bool(result.get("isError")) if result is not None else False,
                        )
                    )
            items.append(item)
        elif role == "toolResult":
            if str(message.get("toolCallId")) not in called:
                items.append(Item("tool", eid, ts, _text(message.get("content"))))
        elif etype == "branch_summary":
            items.append(Item("branch", eid, ts, _cut(str(entry.get("summary") or ""))))
        elif etype == "compaction":
            before = entry.get("tokensBefore")
            meta = f"{before} tokens before" if before is not None else ""
            items.append(
                Item("compaction", eid, ts, _cut(str(entry.get("summary") or "")), meta=meta)
            )
        elif etype == "custom_message":
            items.append(Item("note", eid, ts, _text(entry.get("content")), meta="custom message"))
        else:
            items.append(Item("note", eid, ts, _note(entry), branches=branches))
    return items


def _assistant_meta(message: Mapping[str, Any]) -> str:
    parts = [f"{message.get('provider', '')}/{message.get('model', '')}"]
    if message.get("stopReason"):
        parts.append(str(message["stopReason"]))
    usage = message.get("usage")
    cost = message_cost(usage)
    if cost or (usage and cost is None):
        parts.append(format_cost(cost, 4))
    if message.get("errorMessage"):
        parts.append(f"error: {message['errorMessage']}")
    return " · ".join(parts)


_NOTES = {
    "model_change": "model: {provider}/{modelId}",
    "thinking_level_change": "thinking level: {thinkingLevel}",
    "label": "label {label!r} on {targetId}",
    "session_info": "name: {name}",
}
"""How an entry that is no message is noted in the transcript, by its type."""


class _Fields(dict[str, Any]):
    def __missing__(self, key: str) -> None:
        return None


def _note(entry: Mapping[str, Any]) -> str:
    form = _NOTES.get(str(entry.get("type")))
    return form.format_map(_Fields(entry)) if form else str(entry.get("type"))
