"""What the client sees: harness events (:class:`EventTranslator`) and transcript entries
(:func:`replay`) as ACP ``session/update`` payloads of the same shapes, so a live run and its
replay by ``session/load`` read alike (``design/acp.md``, "Objects")."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    PlanEntry,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolKind,
    UserMessageChunk,
)

from durable_harness.display import clip, visible
from durable_harness.recovery.decide import LanePlan

Update = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCallStart
    | ToolCallProgress
    | AgentPlanUpdate
)
"""The ``session/update`` payloads this agent sends."""

TOOL_KINDS: dict[str, ToolKind] = {
    "read_file": "read",
    "write_file": "edit",
    "edit_file": "edit",
    "append_file": "edit",
    "bash": "execute",
}
"""The ACP tool kind of each built-in tool (others are ``other``)."""

_TITLE_ARG = {"bash": "command"}
_TITLE_CAP = 120
_BLANKS = re.compile(r"[ \t\n]+")


def tool_title(name: str, arguments: dict[str, Any]) -> str:
    """A call's one-line title: its tool and main argument, shown as ``design/acp.md`` says."""
    key = _TITLE_ARG.get(name, "path")
    value = arguments.get(key)
    title = f"{name}: {value}" if isinstance(value, str) and value else name
    title = visible(_BLANKS.sub(" ", title.strip(" \t\n")))
    return clip(title, _TITLE_CAP)


def tool_call_started(cwd: str, call: dict[str, Any]) -> ToolCallStart:
    """The ``tool_call`` update (status ``pending``) of an assistant's ``toolCall`` block
    (``{"id", "name", "arguments"}``); its location is the file it touches, under ``cwd``."""
    name = str(call.get("name", ""))
    arguments = call.get("arguments")
    args = arguments if isinstance(arguments, dict) else {}
    path = args.get("path")
    where = (
        [ToolCallLocation(path=str(Path(cwd) / path))] if isinstance(path, str) and path else None
    )
    return start_tool_call(
        str(call.get("id", "")),
        tool_title(name, args),
        kind=TOOL_KINDS.get(name, "other"),
        status="pending",
        locations=where,
        raw_input=args,
    )


def tool_call_settled(result: dict[str, Any]) -> ToolCallProgress:
    """The ``tool_call_update`` of a ``toolResult`` message: ``failed`` when it is an error,
    else ``completed``, with its text blocks as content."""
    texts = [
        str(block.get("text", ""))
        for block in result.get("content") or []
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    return update_tool_call(
        str(result.get("toolCallId", "")),
        status="failed" if result.get("isError") else "completed",
        content=[tool_content(text_block("".join(texts)))],
    )


def _assistant_blocks(cwd: str, message: dict[str, Any], *, text: bool) -> list[Update]:
    out: list[Update] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and text and block.get("text"):
            out.append(update_agent_message_text(str(block["text"])))
        elif kind == "thinking" and text and block.get("thinking"):
            out.append(update_agent_thought_text(str(block["thinking"])))
        elif kind == "toolCall":
            out.append(tool_call_started(cwd, block))
    return out


def replay(cwd: str, entries: Iterable[dict[str, Any]]) -> list[Update]:
    """The updates that rebuild a transcript's messages for a client (``session/load``)."""
    out: list[Update] = []
    for entry in entries:
        message = entry.get("message") if entry.get("type") == "message" else None
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "user":
            content = message.get("content")
            as_blocks = [{"type": "text", "text": content}] if isinstance(content, str) else None
            for block in as_blocks or content or []:
                if isinstance(block, dict) and block.get("type") == "text":
                    out.append(update_user_message_text(str(block.get("text", ""))))
        elif role == "assistant":
            out.extend(_assistant_blocks(cwd, message, text=True))
        elif role == "toolResult":
            out.append(tool_call_settled(message))
    return out


class EventTranslator:
    """Turns one session's harness events into updates, in order; ``result_of`` reads a settled
    call's ``toolResult`` message (or ``None``) from the transcript."""

    def __init__(self, cwd: str, result_of: Callable[[str], dict[str, Any] | None]) -> None:
        self.cwd = cwd
        self.result_of = result_of
        self.stop_reasons: dict[str, str] = {}  # run id -> the last assistant stopReason
        self.open_calls: dict[str, list[str]] = {}  # run id -> announced, unsettled call ids
        self.streamed: set[str] = set()  # run ids whose current attempt has sent text

    def feed(self, event: dict[str, Any]) -> list[Update]:
        """The updates ``event`` makes (often none)."""
        etype = event.get("type")
        if event.get("purpose", "turn") != "turn":
            return []  # a compaction or branch summary is not part of the conversation
        if etype == "message_update":
            if isinstance(event.get("delta"), str) and event["delta"]:
                self.streamed.add(str(event.get("runId")))
                return [update_agent_message_text(event["delta"])]
            if isinstance(event.get("thinking"), str) and event["thinking"]:
                return [update_agent_thought_text(event["thinking"])]
            return []
        if etype == "provider_request_end":
            # a failed attempt's streamed text is closed by a notice (design/acp.md, "Objects")
            run_id = str(event.get("runId"))
            streamed = run_id in self.streamed
            self.streamed.discard(run_id)
            if event.get("outcome") != "error" or not streamed:
                return []
            again = "; retrying" if event.get("retryable") else ""
            notice = f"[attempt {event.get('attempt')} failed: {event.get('error')}{again}]"
            return [update_agent_message_text(f"\n\n{visible(notice)}\n\n")]
        if etype == "message_end":
            message = event.get("message")
            if not isinstance(message, dict):
                return []
            run_id = str(event.get("runId"))
            self.stop_reasons[run_id] = str(message.get("stopReason", ""))
            started = _assistant_blocks(self.cwd, message, text=False)
            self.open_calls.setdefault(run_id, []).extend(
                u.tool_call_id for u in started if isinstance(u, ToolCallStart)
            )
            return started
        if etype == "run_end":
            # an abort settles its open calls in one commit, without tool events: their
            # results are in the transcript (a suspended run's calls stay open: in doubt)
            open_calls = self.open_calls.pop(str(event.get("runId")), [])
            if event.get("outcome") == "suspended":
                return []
            return [self._settled(call_id, failed=True) for call_id in open_calls]
        if etype == "tool_execution_end":
            call_id = str(event.get("toolCallId", ""))
            calls = self.open_calls.get(str(event.get("runId")), [])
            if call_id in calls:
                calls.remove(call_id)
            return [self._settled(call_id, failed=bool(event.get("isError")))]
        return []

    def _settled(self, call_id: str, *, failed: bool) -> Update:
        """The call's settling update from its result in the transcript, else bare."""
        result = self.result_of(call_id)
        if result is None:
            return update_tool_call(call_id, status="failed" if failed else "completed")
        return tool_call_settled(result)


def recovery_plan(lanes: list[LanePlan], status: Literal["pending", "completed"]) -> Update:
    """The recovery plan as a ``plan`` update: an entry per interrupted run and in-doubt call."""
    texts = []
    for lp in lanes:
        action = lp.next_action.replace("_", " ")
        texts.append(f"Resume run {lp.run_id} on lane {lp.lane}: {action}")
        doubt = "(started before the crash, outcome unknown)"
        texts += [f"Decide {c.tool_name} call {c.tool_call_id} {doubt}" for c in lp.waiting()]
    entries = [PlanEntry(content=visible(t), priority="high", status=status) for t in texts]
    return update_plan(entries)
