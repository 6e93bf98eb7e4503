"""Building the provider context from a leaf: a pure function of (entry getter, leaf id).

Rules (pi's ``buildSessionContext``, plus the brief's guarantees):

1. Walk from the leaf to the root through ``parentId``. A missing parent ends the walk (the
   entry is treated as a root; storage reports the damage).
2. The last compaction on the path replaces everything before its ``firstKeptEntryId`` with a
   user-role summary message; entries between the first kept entry and the compaction follow,
   then everything after the compaction.
3. Branch summaries, custom messages, ``custom`` and ``bashExecution`` messages become user-role
   context. ``model_change``, ``thinking_level_change``, labels, ``session_info`` and ``custom``
   entries contribute no message.
4. Settings (model, thinking level) come from the whole path; a compaction that carries a
   ``settings`` snapshot lets the walk stop at the cut.
5. Well-formed for providers: an assistant message with empty content is dropped; every tool
   call gets exactly one result (the first stored one); a call without a stored result gets a
   synthetic error result marked *interrupted, outcome unknown*; a result without its call is
   dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable_harness.models.messages import text_of

INTERRUPTED_TEXT = (
    "Tool call interrupted: the process stopped while this tool was running and its outcome is "
    "unknown. It has not been retried."
)

EntryGetter = Callable[[str], dict[str, Any] | None]


@dataclass
class Context:
    """What the next provider request carries.

    Attributes:
        messages: ``user``/``assistant``/``toolResult`` dicts, ready for a provider.
        model: ``{"provider", "modelId"}`` or ``None``.
        thinking_level: the effective thinking level (``off`` by default).
        entry_ids: ids of the entries the messages came from, in order (``None`` for synthetic).
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    model: dict[str, str] | None = None
    thinking_level: str = "off"
    entry_ids: list[str | None] = field(default_factory=list)
    state: ContextState | None = None


def path_to(get_entry: EntryGetter, leaf_id: str | None) -> list[dict[str, Any]]:
    """Return the entries from the root to ``leaf_id`` (empty for ``None``), cycle-safe."""
    path: list[dict[str, Any]] = []
    seen: set[str] = set()
    current = get_entry(leaf_id) if leaf_id else None
    while current is not None and current.get("id") not in seen:
        seen.add(str(current.get("id")))
        path.append(current)
        parent = current.get("parentId")
        current = get_entry(parent) if parent else None
    path.reverse()
    return path


def _walk(get_entry: EntryGetter, leaf_id: str | None) -> list[dict[str, Any]]:
    """Walk up from the leaf, stopping early at a compaction with a settings snapshot."""
    up: list[dict[str, Any]] = []
    seen: set[str] = set()
    compaction: dict[str, Any] | None = None
    current = get_entry(leaf_id) if leaf_id else None
    while current is not None and current.get("id") not in seen:
        seen.add(str(current.get("id")))
        up.append(current)
        if compaction is None and current.get("type") == "compaction":
            compaction = current
        if (
            compaction is not None
            and current.get("id") == compaction.get("firstKeptEntryId")
            and isinstance(compaction.get("settings"), dict)
        ):
            break
        parent = current.get("parentId")
        current = get_entry(parent) if parent else None
    up.reverse()
    return up


def summary_message(kind: str, summary: str, timestamp: Any = None) -> dict[str, Any]:
    """Return the user-role message standing for a compaction or branch summary."""
    if kind == "compaction":
        text = (
            "The conversation history before this point was compacted into the following "
            f"summary:\n<summary>\n{summary}\n</summary>"
        )
    else:
        text = (
            "The following is a summary of a branch that this conversation came back from:\n"
            f"<summary>\n{summary}\n</summary>"
        )
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": timestamp}


def entry_message(entry: dict[str, Any]) -> dict[str, Any] | None:
    """Return the context message an entry contributes, or ``None``."""
    etype = entry.get("type")
    if etype == "message":
        msg = entry.get("message") or {}
        role = msg.get("role")
        if role in ("user", "assistant", "toolResult"):
            return dict(msg)
        if role in ("custom", "hookMessage"):
            return {
                "role": "user",
                "content": msg.get("content", ""),
                "timestamp": msg.get("timestamp"),
            }
        if role == "bashExecution":
            text = f"Ran `{msg.get('command', '')}`\n```\n{msg.get('output', '')}\n```"
            if msg.get("exitCode") not in (None, 0, "0"):
                text += f"\nexit code {msg.get('exitCode')}"
            return {
                "role": "user",
                "content": [{"type": "text", "text": text}],
                "timestamp": msg.get("timestamp"),
            }
        return None
    if etype == "custom_message":
        return {"role": "user", "content": entry.get("content", ""), "timestamp": None}
    if etype == "branch_summary" and entry.get("summary"):
        return summary_message("branch", str(entry["summary"]))
    return None


@dataclass
class ContextState:
    """What :func:`build_context` needs to extend a context built for ``leaf_id`` to a leaf
    below it without walking the whole path again: the messages before rule 5, the settings."""

    leaf_id: str | None
    pairs: list[tuple[dict[str, Any], str | None]]
    model: dict[str, str] | None
    thinking_level: str
    tokens: int = 0
    formed_messages: list[dict[str, Any]] = field(default_factory=list)
    formed_ids: list[str | None] = field(default_factory=list)
    formed_upto: int = 0


def _settings(
    entry: dict[str, Any], model: dict[str, str] | None, thinking: str
) -> tuple[dict[str, str] | None, str]:
    etype = entry.get("type")
    if etype == "thinking_level_change":
        thinking = str(entry.get("thinkingLevel", "off"))
    elif etype == "model_change":
        model = {"provider": str(entry.get("provider")), "modelId": str(entry.get("modelId"))}
    elif etype == "message" and (entry.get("message") or {}).get("role") == "assistant":
        msg = entry["message"]
        if msg.get("model"):
            model = {"provider": str(msg.get("provider")), "modelId": str(msg["model"])}
    elif etype == "compaction" and isinstance(entry.get("settings"), dict):
        model = entry["settings"].get("model", model)
        thinking = entry["settings"].get("thinkingLevel", thinking)
    return model, thinking


def _extend(
    get_entry: EntryGetter, leaf_id: str | None, previous: ContextState, max_steps: int = 64
) -> ContextState | None:
    """Extend ``previous`` to ``leaf_id`` when the leaf descends from ``previous.leaf_id``
    through at most ``max_steps`` entries and no compaction; else ``None``."""
    new: list[dict[str, Any]] = []
    cursor = leaf_id
    while cursor != previous.leaf_id:  # compare ids first: the old leaf itself is not read
        current = get_entry(cursor) if cursor else None
        if current is None:
            if previous.leaf_id is not None:
                return None  # not a descendant (or a missing parent): rebuild in full
            break
        if len(new) >= max_steps or current.get("type") == "compaction":
            return None
        new.append(current)
        cursor = current.get("parentId")
    pairs = list(previous.pairs)
    model, thinking = previous.model, previous.thinking_level
    for entry in reversed(new):
        model, thinking = _settings(entry, model, thinking)
        _add(pairs, entry)
    tokens = previous.tokens + estimate_tokens([m for m, _ in pairs[len(previous.pairs) :]])
    return ContextState(
        leaf_id,
        pairs,
        model,
        thinking,
        tokens,
        previous.formed_messages,
        previous.formed_ids,
        previous.formed_upto,
    )


def _full(get_entry: EntryGetter, leaf_id: str | None) -> ContextState:
    path = _walk(get_entry, leaf_id)
    model: dict[str, str] | None = None
    thinking = "off"
    compaction_idx = None
    for i, entry in enumerate(path):
        model, thinking = _settings(entry, model, thinking)
        if entry.get("type") == "compaction":
            compaction_idx = i
    pairs: list[tuple[dict[str, Any], str | None]] = []
    if compaction_idx is not None:
        comp = path[compaction_idx]
        summary = summary_message("compaction", str(comp.get("summary", "")), comp.get("timestamp"))
        pairs.append((summary, comp.get("id")))
        first_kept = comp.get("firstKeptEntryId")
        kept = False
        for entry in path[:compaction_idx]:
            kept = kept or entry.get("id") == first_kept
            if kept:
                _add(pairs, entry)
        for entry in path[compaction_idx + 1 :]:
            _add(pairs, entry)
    else:
        for entry in path:
            _add(pairs, entry)
    return ContextState(leaf_id, pairs, model, thinking, estimate_tokens([m for m, _ in pairs]))


def _form(state: ContextState) -> tuple[list[dict[str, Any]], list[str | None]]:
    """Apply rule 5 to ``state.pairs``, reusing the part already formed: rule 5 works block by
    block, and a block ends where the next assistant or user message starts, so everything
    before the last such message is final. Returns the messages and their entry ids."""
    pairs = state.pairs
    cut = state.formed_upto
    for j in range(len(pairs) - 1, state.formed_upto - 1, -1):
        if pairs[j][0].get("role") in ("assistant", "user"):
            cut = j
            break
    if cut > state.formed_upto:
        done = well_formed(pairs[state.formed_upto : cut])
        # New lists, never appended in place: an earlier state may share the old ones.
        state.formed_messages = state.formed_messages + [m for m, _ in done]
        state.formed_ids = state.formed_ids + [eid for _, eid in done]
        state.formed_upto = cut
    tail = well_formed(pairs[state.formed_upto :])
    return (
        state.formed_messages + [m for m, _ in tail],
        state.formed_ids + [eid for _, eid in tail],
    )


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """Estimate the tokens of context messages: characters / 4, rounded up."""
    chars = 0
    for m in messages:
        chars += len(text_of(m.get("content")))
        for b in m.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "toolCall":
                chars += len(str(b.get("arguments"))) + len(str(b.get("name")))
    return -(-chars // 4)


def build_context(
    get_entry: EntryGetter, leaf_id: str | None, previous: ContextState | None = None
) -> Context:
    """Build the provider context from ``leaf_id`` (see the module docstring for the rules).

    With ``previous`` (the ``state`` of a context built for an ancestor of ``leaf_id``), only the
    entries below that ancestor are read: a run's context grows by a turn at a time instead of
    being rebuilt from the root. The result is the same either way.
    """
    state = _extend(get_entry, leaf_id, previous) if previous is not None else None
    if state is None:
        state = _full(get_entry, leaf_id)
    messages, entry_ids = _form(state)
    return Context(
        messages=messages,
        model=state.model,
        thinking_level=state.thinking_level,
        entry_ids=entry_ids,
        state=state,
    )


def _add(pairs: list[tuple[dict[str, Any], str | None]], entry: dict[str, Any]) -> None:
    msg = entry_message(entry)
    if msg is not None:
        pairs.append((msg, entry.get("id")))


def interrupted_result(call: dict[str, Any]) -> dict[str, Any]:
    """Return the synthetic error result for a tool call whose outcome is unknown."""
    return {
        "role": "toolResult",
        "toolCallId": call.get("id"),
        "toolName": call.get("name"),
        "content": [{"type": "text", "text": INTERRUPTED_TEXT}],
        "isError": True,
        "interrupted": True,
    }


def well_formed(
    pairs: list[tuple[dict[str, Any], str | None]],
) -> list[tuple[dict[str, Any], str | None]]:
    """Enforce rule 5: no empty assistant message, exactly one result per tool call."""
    out: list[tuple[dict[str, Any], str | None]] = []
    i = 0
    while i < len(pairs):
        msg, eid = pairs[i]
        role = msg.get("role")
        if role == "toolResult":
            i += 1  # a result whose call is not directly before it
            continue
        if role == "assistant":
            content = msg.get("content") or []
            if is_empty_assistant(content):
                i += 1
                continue
            out.append((msg, eid))
            calls = [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]
            j = i + 1
            results: dict[str, tuple[dict[str, Any], str | None]] = {}
            while j < len(pairs) and pairs[j][0].get("role") == "toolResult":
                rid = str(pairs[j][0].get("toolCallId"))
                results.setdefault(rid, pairs[j])
                j += 1
            for call in calls:
                out.append(results.get(str(call.get("id")), (interrupted_result(call), None)))
            i = j
            continue
        out.append((msg, eid))
        i += 1
    return out


def is_empty_assistant(content: Any) -> bool:
    """True when assistant ``content`` has no text, tool call or image worth sending."""
    if isinstance(content, str):
        return not content.strip()
    return not any(
        isinstance(b, dict)
        and (
            b.get("type") in ("toolCall", "image")
            or (b.get("type") == "text" and str(b.get("text", "")).strip())
        )
        for b in content or []
    )


def context_text(messages: list[dict[str, Any]]) -> str:
    """Render context messages as plain text (for the CLI's human form)."""
    lines = []
    for m in messages:
        role = m.get("role")
        body = text_of(m.get("content"))
        for b in m.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "toolCall":
                args = json.dumps(b.get("arguments"), ensure_ascii=False, default=str)
                body += f"\n  -> {b.get('name')}({args}) [{b.get('id')}]"
        if role == "toolResult":
            role = f"toolResult[{m.get('toolCallId')}]"
        lines.append(f"{role}: {body.strip()}")
    return "\n".join(lines)
