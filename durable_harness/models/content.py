"""Plain functions over a message's content (lists of block dicts, in pi's shapes:
``design/context.md``), apart from the models of :mod:`durable_harness.models.messages`: every
reader of a message needs them, and importing them builds no pydantic schema (a CLI command that
only reads sessions starts about 0.2 s sooner: ``design/cli.md``, "Start-up")."""

from __future__ import annotations

from typing import Any


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
