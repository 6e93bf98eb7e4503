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
   call gets exactly one result; a call without a stored result gets a synthetic error result
   marked *interrupted, outcome unknown*; a result without its call is dropped. When a call
   has more stored results than it can take, placeholders (pi's "No result provided", our
   interrupted marker) give way to a real result; then the first is kept.
6. One identity per call: results pair with calls by order of occurrence among equal ids (two
   calls sharing ``call_0`` take the first and second ``call_0`` results). The ids the provider
   sees are unique over the whole context: a repeated id becomes ``<id>_2`` (``_3``...), on the
   call block and its result alike; ids are otherwise left as stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from durable_harness.models.content import text_of, tool_call_blocks

INTERRUPTED_TEXT = (
    "Tool call interrupted: the process stopped while this tool was running and its outcome is "
    "unknown. It has not been retried."
)
PLACEHOLDER_TEXTS = frozenset({INTERRUPTED_TEXT, "No result provided"})
"""Result texts that stand in for a missing result (ours, and pi's synthetic one): a real result
for the same call wins over them."""

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
    return _walk(get_entry, leaf_id, to_root=True)


def _walk(
    get_entry: EntryGetter, leaf_id: str | None, to_root: bool = False
) -> list[dict[str, Any]]:
    """The path from the root (or, unless ``to_root``, from the cut of the last compaction
    with a settings snapshot: rule 4) to the leaf, cycle-safe."""
    up: list[dict[str, Any]] = []
    seen: set[str] = set()
    compaction: dict[str, Any] | None = None
    current = get_entry(leaf_id) if leaf_id else None
    while current is not None and current.get("id") not in seen:
        seen.add(str(current.get("id")))
        up.append(current)
        if compaction is None and current.get("type") == "compaction" and not to_root:
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
    below it without walking the whole path again: the messages before rule 5, the settings.

    An extension takes over the lists and the set of the state it extends (they grow in place:
    a turn's extension copies nothing of the path before it) and marks that state ``consumed``;
    a consumed state given again is rebuilt from the root instead (the same result, read in
    full)."""

    leaf_id: str | None
    pairs: list[tuple[dict[str, Any], str | None]]
    model: dict[str, str] | None
    thinking_level: str
    tokens: int = 0
    formed_messages: list[dict[str, Any]] = field(default_factory=list)
    formed_ids: list[str | None] = field(default_factory=list)
    formed_upto: int = 0
    formed_call_ids: set[str] = field(default_factory=set)
    #: the last tail :func:`_form` formed: ``pairs[tail_from:tail_to]`` after rule 5, and the
    #: call ids it gave out (reused when that tail becomes final unchanged)
    tail: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    tail_from: int = -1
    tail_to: int = -1
    tail_call_ids: set[str] = field(default_factory=set)
    consumed: bool = False


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
    get_entry: EntryGetter,
    leaf_id: str | None,
    previous: ContextState,
    max_steps: int = 64,
    pi_turns: bool = False,
) -> ContextState | None:
    """Extend ``previous`` to ``leaf_id`` when the leaf descends from ``previous.leaf_id``
    through at most ``max_steps`` entries and no compaction (``previous`` is then consumed);
    else ``None``, ``previous`` untouched."""
    if previous.consumed:
        return None
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
    previous.consumed = True
    pairs = previous.pairs
    start = len(pairs)
    model, thinking = previous.model, previous.thinking_level
    for entry in reversed(new):
        model, thinking = _settings(entry, model, thinking)
        _add(pairs, entry, pi_turns)
    tokens = previous.tokens + estimate_tokens([m for m, _ in pairs[start:]])
    # built field by field: dataclasses.replace cost more than the rest of an extension
    return ContextState(
        leaf_id,
        pairs,
        model,
        thinking,
        tokens,
        previous.formed_messages,
        previous.formed_ids,
        previous.formed_upto,
        previous.formed_call_ids,
        previous.tail,
        previous.tail_from,
        previous.tail_to,
        previous.tail_call_ids,
    )


def _full(get_entry: EntryGetter, leaf_id: str | None, pi_turns: bool = False) -> ContextState:
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
                _add(pairs, entry, pi_turns)
        for entry in path[compaction_idx + 1 :]:
            _add(pairs, entry, pi_turns)
    else:
        for entry in path:
            _add(pairs, entry, pi_turns)
    return ContextState(leaf_id, pairs, model, thinking, estimate_tokens([m for m, _ in pairs]))


def _form(state: ContextState) -> tuple[list[dict[str, Any]], list[str | None]]:
    """Apply rule 5 to ``state.pairs``, reusing the part already formed: rule 5 works block by
    block, and a block ends where the next assistant or user message starts, so everything
    before the last such message is final. Returns the messages and their entry ids (new
    lists: the formed ones grow in place).

    The tail (from the last assistant or user message on) is formed each time; when the same
    pairs become final later (a run's turn: the next answer starts a new block), the tail
    formed then is taken as it is: rule 5 is a function of those pairs and the call ids used
    before them, both unchanged, so each block is formed once."""
    pairs = state.pairs
    upto = state.formed_upto
    cut = upto
    for j in range(len(pairs) - 1, upto - 1, -1):
        if pairs[j][0].get("role") in ("assistant", "user"):
            cut = j
            break
    used = state.formed_call_ids
    if cut > upto:
        if state.tail_from == upto and state.tail_to == cut:
            done = state.tail
            used.update(state.tail_call_ids)
        else:
            done = well_formed(pairs[upto:cut], used)
        state.formed_messages.extend([m for m, _ in done])
        state.formed_ids.extend([eid for _, eid in done])
        state.formed_upto = upto = cut
    added: set[str] = set()
    tail = well_formed(pairs[upto:], _Overlay(used, added))
    state.tail, state.tail_from, state.tail_to, state.tail_call_ids = tail, upto, len(pairs), added
    return (
        state.formed_messages + [m for m, _ in tail],
        state.formed_ids + [eid for _, eid in tail],
    )


class CallIds(Protocol):
    """The call ids in use, as :func:`well_formed` reads and grows them (a ``set`` is one)."""

    def __contains__(self, cid: object) -> bool: ...

    def add(self, cid: str) -> None: ...

    def update(self, cids: Iterable[str]) -> None: ...


class _Overlay:
    """``base`` and ``added`` read as one set of call ids, what is given out going to
    ``added`` only: a tail is formed against the formed part's ids without copying them."""

    __slots__ = ("added", "base")

    def __init__(self, base: set[str], added: set[str]) -> None:
        self.base, self.added = base, added

    def __contains__(self, cid: object) -> bool:
        return cid in self.added or cid in self.base

    def add(self, cid: str) -> None:
        self.added.add(cid)

    def update(self, cids: Iterable[str]) -> None:
        self.added.update(cids)


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """Estimate the tokens of context messages: characters / 4, rounded up (the characters of
    the text blocks, and of each tool call's arguments and name as ``str`` shows them)."""
    chars = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
            continue
        if isinstance(content, list):  # one pass over the blocks, the common case
            counted = _block_chars(content)
            if counted >= 0:
                chars += counted
                continue
        chars += len(text_of(content))
        for b in tool_call_blocks(content):
            chars += len(str(b.get("arguments"))) + len(str(b.get("name")))
    return -(-chars // 4)


def _block_chars(content: list[Any]) -> int:
    """What :func:`estimate_tokens` counts in a list of blocks, in one pass; -1 when a text
    block's ``text`` is no string (the general path then says what it says)."""
    chars = 0
    for b in content:
        if isinstance(b, dict):
            btype = b.get("type")
            if btype == "text":
                text = b.get("text", "")
                if type(text) is not str:
                    return -1
                chars += len(text)
            elif btype == "toolCall":
                chars += len(str(b.get("arguments"))) + len(str(b.get("name")))
    return chars


def build_context(
    get_entry: EntryGetter,
    leaf_id: str | None,
    previous: ContextState | None = None,
    *,
    pi_turns: bool = False,
) -> Context:
    """Build the provider context from ``leaf_id`` (see the module docstring for the rules).

    ``pi_turns`` (a session written by pi: ``design/context.md``, "pi sessions") drops
    assistant messages that ended in ``error`` or ``aborted``, as pi does before sending; the
    results of their calls then have no call before them and are dropped too (rule 5).

    With ``previous`` (the ``state`` of a context built for an ancestor of ``leaf_id``), only the
    entries below that ancestor are read: a run's context grows by a turn at a time instead of
    being rebuilt from the root. The result is the same either way.
    """
    state = None
    if previous is not None:
        state = _extend(get_entry, leaf_id, previous, pi_turns=pi_turns)
    if state is None:
        state = _full(get_entry, leaf_id, pi_turns)
    messages, entry_ids = _form(state)
    return Context(
        messages=messages,
        model=state.model,
        thinking_level=state.thinking_level,
        entry_ids=entry_ids,
        state=state,
    )


FAILED_STOPS = ("error", "aborted")
"""The ``stopReason`` values of a turn pi does not replay (pi-ai's ``transformMessages``)."""


def _add(
    pairs: list[tuple[dict[str, Any], str | None]], entry: dict[str, Any], pi_turns: bool = False
) -> None:
    msg = entry_message(entry)
    failed = (
        msg is not None and msg.get("role") == "assistant" and msg.get("stopReason") in FAILED_STOPS
    )
    if msg is not None and not (pi_turns and failed):
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


def is_placeholder_result(msg: dict[str, Any]) -> bool:
    """True for a stored result that only stands in for a missing one (see
    :data:`PLACEHOLDER_TEXTS`, or our ``interrupted`` flag)."""
    if msg.get("interrupted") is True:
        return True
    return text_of(msg.get("content")).strip() in PLACEHOLDER_TEXTS


def _unique_id(call_id: str, used: CallIds) -> str:
    """``call_id`` if unused, else ``<call_id>_2``, ``_3``... (``call`` for an empty id); the id
    returned is added to ``used``."""
    base = call_id or "call"
    new, n = call_id, 1
    while not new or new in used:
        n += 1
        new = f"{base}_{n}"
    used.add(new)
    return new


def _pair_results(
    calls: list[dict[str, Any]], results: list[tuple[dict[str, Any], str | None]]
) -> list[tuple[dict[str, Any], str | None] | None]:
    """Pair the results that follow an assistant message with its calls (rule 5 and 6):
    per stored id, by order of occurrence; surplus placeholders go first, then later results."""
    by_id: dict[str, list[tuple[dict[str, Any], str | None]]] = {}
    for pair in results:
        by_id.setdefault(str(pair[0].get("toolCallId")), []).append(pair)
    wanted: dict[str, int] = {}
    for call in calls:
        key = str(call.get("id"))
        wanted[key] = wanted.get(key, 0) + 1
    for key, found in by_id.items():
        surplus = len(found) - wanted.get(key, 0)
        if surplus > 0:
            kept = list(found)
            for pair in found:
                if surplus and is_placeholder_result(pair[0]):
                    kept.remove(pair)
                    surplus -= 1
            by_id[key] = kept
    taken: dict[str, int] = {}
    out: list[tuple[dict[str, Any], str | None] | None] = []
    for call in calls:
        key = str(call.get("id"))
        index = taken.get(key, 0)
        taken[key] = index + 1
        found = by_id.get(key, [])
        out.append(found[index] if index < len(found) else None)
    return out


def _one_result_each(
    calls: list[dict[str, Any]],
    results: list[tuple[dict[str, Any], str | None]],
    used: CallIds,
) -> list[tuple[dict[str, Any], str | None]] | None:
    """The results in call order when every call has a distinct, unused, non-empty id and
    exactly one result (what the harness itself writes); ``None`` when rules 5 and 6 have
    work to do. The ids are added to ``used``."""
    if len(results) != len(calls):
        return None
    if len(calls) == 1:  # one call, one result: what most answers ask for
        cid = calls[0].get("id")
        if not (isinstance(cid, str) and cid and cid not in used):
            return None
        if results[0][0].get("toolCallId") != cid:
            return None
        used.add(cid)
        return list(results)
    by_id = {r[0].get("toolCallId"): r for r in results}
    ids = [c.get("id") for c in calls]
    if len(by_id) != len(calls) or not all(
        isinstance(cid, str) and cid and cid in by_id and cid not in used for cid in ids
    ):
        return None
    if len(set(ids)) != len(ids):
        return None
    used.update(ids)  # type: ignore[arg-type]
    return [by_id[cid] for cid in ids]


def well_formed(
    pairs: list[tuple[dict[str, Any], str | None]], used: CallIds | None = None
) -> list[tuple[dict[str, Any], str | None]]:
    """Enforce rules 5 and 6: no empty assistant message, exactly one result per tool call,
    call ids unique. ``used`` holds the call ids already sent earlier in the context; the ids
    given out here are added to it. Messages whose ids change are copies (entries are never
    modified)."""
    used = set() if used is None else used
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
            calls = tool_call_blocks(content)
            j = i + 1
            while j < len(pairs) and pairs[j][0].get("role") == "toolResult":
                j += 1
            simple = _one_result_each(calls, pairs[i + 1 : j], used)
            if simple is not None:  # the common case: nothing to pair or rename
                out.append((msg, eid))
                out += simple
                i = j
                continue
            paired = _pair_results(calls, pairs[i + 1 : j])
            new_ids = [_unique_id(str(c.get("id") or ""), used) for c in calls]
            if any(new != c.get("id") for new, c in zip(new_ids, calls, strict=True)):
                renamed = iter(new_ids)
                msg = {
                    **msg,
                    "content": [
                        {**b, "id": next(renamed)}
                        if isinstance(b, dict) and b.get("type") == "toolCall"
                        else b
                        for b in content
                    ],
                }
            out.append((msg, eid))
            for call, new_id, pair in zip(calls, new_ids, paired, strict=True):
                if pair is None:
                    out.append((interrupted_result({**call, "id": new_id}), None))
                elif pair[0].get("toolCallId") != new_id:
                    out.append(({**pair[0], "toolCallId": new_id}, pair[1]))
                else:
                    out.append(pair)
            i = j
            continue
        out.append((msg, eid))
        i += 1
    return out


def is_empty_assistant(content: Any) -> bool:
    """True when assistant ``content`` has no text, tool call or image worth sending."""
    if isinstance(content, str):
        return not content.strip()
    for b in content or []:  # a loop, not any(<generator>): it runs on every answer
        if isinstance(b, dict):
            btype = b.get("type")
            if btype == "toolCall" or btype == "image":
                return False
            if btype == "text" and str(b.get("text", "")).strip():
                return False
    return True


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
