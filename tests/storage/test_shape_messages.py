"""The shape checks are written flat for speed (``storage/shapes.py``); the message a malformed
entry or record gets must stay the one the plain rule gives, fault for fault, in the same order.
The plain rule is restated here and compared on generated values of every wrong kind."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from durable_harness.storage import shapes
from durable_harness.storage.base import EntryOp, LaneOp, RecordOp


def _opt(value: Any, kind: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, kind)


def plain_record_error(rec: dict[str, Any]) -> str | None:
    if not isinstance(rec.get("type"), str) or not isinstance(rec.get("id"), str):
        return "type and id must be strings"
    if not (_opt(rec.get("lane"), str) and _opt(rec.get("runId"), str)):
        return "lane and runId must be strings or null"
    return None


def plain_content_error(content: Any) -> str | None:
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        return "content must be a string or a list of blocks"
    for b in content:
        if b.get("type") == "toolCall" and not (
            isinstance(b.get("id"), str)
            and isinstance(b.get("name"), str)
            and _opt(b.get("arguments"), dict)
        ):
            return "a toolCall block needs string id and name and object arguments"
    return None


def plain_entry_error(entry: dict[str, Any]) -> str | None:
    if not isinstance(entry.get("type"), str) or not isinstance(entry.get("id"), str):
        return "type and id must be strings"
    if not _opt(entry.get("parentId"), str):
        return "parentId must be a string or null"
    etype = entry["type"]
    if etype == "message":
        msg = entry.get("message")
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            return "message must be an object with a string role"
        if "content" in msg or msg["role"] in ("user", "assistant", "toolResult"):
            err = plain_content_error(msg.get("content"))
            if err:
                return err
        if msg["role"] == "toolResult" and not isinstance(msg.get("toolCallId"), str):
            return "a toolResult needs a string toolCallId"
        if not _opt(msg.get("usage"), dict):
            return "usage must be an object"
    elif etype == "label" and not isinstance(entry.get("targetId"), str):
        return "a label needs a string targetId"
    elif etype in ("compaction", "branch_summary") and not _opt(entry.get("summary"), str):
        return "summary must be a string"
    elif etype == "compaction" and not _opt(entry.get("firstKeptEntryId"), str):
        return "firstKeptEntryId must be a string or null"
    elif etype in ("model_change",) and not (
        _opt(entry.get("provider"), str) and _opt(entry.get("modelId"), str)
    ):
        return "provider and modelId must be strings"
    return None


anything = st.one_of(
    st.none(), st.integers(), st.text(max_size=3), st.booleans(), st.just([]), st.just({})
)
strings = st.one_of(st.text(max_size=3), anything)


def maybe(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


@st.composite
def blocks(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(anything)
    block: dict[str, Any] = {"type": draw(st.sampled_from(["text", "toolCall", "image", 3]))}
    for key, values in (("id", strings), ("name", strings), ("arguments", anything)):
        block.update(draw(maybe(key, values)))
    return block


contents = st.one_of(anything, st.lists(blocks(), max_size=4))


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    etypes = st.sampled_from(
        ["message", "label", "compaction", "branch_summary", "model_change", "custom", 7]
    )
    entry.update(draw(maybe("type", etypes)))
    entry.update(draw(maybe("id", strings)))
    entry.update(draw(maybe("parentId", strings)))
    if draw(st.booleans()):
        msg: dict[str, Any] = {}
        roles = st.sampled_from(["user", "assistant", "toolResult", "custom", 1])
        msg.update(draw(maybe("role", roles)))
        msg.update(draw(maybe("content", contents)))
        msg.update(draw(maybe("toolCallId", strings)))
        msg.update(draw(maybe("usage", anything)))
        entry["message"] = msg if draw(st.integers(0, 9)) else draw(anything)
    for key in ("targetId", "summary", "firstKeptEntryId", "provider", "modelId"):
        entry.update(draw(maybe(key, strings)))
    return entry


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    for key in ("type", "id", "lane", "runId"):
        rec.update(draw(maybe(key, strings)))
    return rec


@given(entries())
def test_entry_messages_are_the_plain_rules(entry: dict[str, Any]) -> None:
    assert shapes.entry_shape_error(entry) == plain_entry_error(entry)
    assert shapes.op_shape_error(EntryOp(entry)) == plain_entry_error(entry)


@given(records())
def test_record_envelope_messages_are_the_plain_rules(rec: dict[str, Any]) -> None:
    # only the envelope: the registered field checks come after it, as before
    expected = plain_record_error(rec)
    if expected is not None:
        assert shapes.record_shape_error(rec) == expected
        assert shapes.op_shape_error(RecordOp(rec)) == expected
    else:
        assert shapes.record_shape_error(rec) in (None, shapes.record_shape_error(dict(rec)))


def test_ops_of_the_wrong_kind() -> None:
    assert shapes.op_shape_error(EntryOp([])) == "an entry must be an object"  # type: ignore[arg-type]
    assert shapes.op_shape_error(EntryOp({}, lane=3)) == "lane must be a string or null"  # type: ignore[arg-type]
    assert shapes.op_shape_error(RecordOp("x")) == "a record must be an object"  # type: ignore[arg-type]
    assert shapes.op_shape_error(LaneOp(3)) == "lane must be a string"  # type: ignore[arg-type]
    assert shapes.op_shape_error("op") == "not a commit op: str"
