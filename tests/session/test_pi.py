"""Sessions written by the pi coding agent: the real files in ``../shared/data/pi-sessions`` open
in place (read-only, unmodified), migrate in memory, and give well-formed contexts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import ReadOnlySession
from durable_harness.session import Session, import_pi_file, open_session
from durable_harness.session.pi import migrate, open_pi_file, read_lines
from durable_harness.storage import EntryOp, Store, open_store

FILES = ["v3-branched.jsonl", "before-compaction.jsonl", "large-session.jsonl"]
V1_FILES = ["before-compaction.jsonl", "large-session.jsonl"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _text(message: dict[str, Any]) -> str:
    c = message.get("content")
    if isinstance(c, str):
        return c
    return "".join(b.get("text", "") for b in c or [] if b.get("type") == "text")


def _file_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def assert_well_formed(messages: list[dict[str, Any]]) -> None:
    """Every tool call has exactly one result, right after its message; no empty assistant."""
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m["role"] in ("user", "assistant", "toolResult"), m["role"]
        if m["role"] == "toolResult":
            raise AssertionError(f"tool result {m.get('toolCallId')} without its call at {i}")
        if m["role"] == "assistant":
            content = m["content"]
            assert any(
                b.get("type") in ("toolCall", "image")
                or (b.get("type") == "text" and b["text"].strip())
                for b in content
            ), f"empty assistant message at {i}"
            calls = [b["id"] for b in content if b.get("type") == "toolCall"]
            results = messages[i + 1 : i + 1 + len(calls)]
            assert [r["role"] for r in results] == ["toolResult"] * len(calls)
            assert sorted(r["toolCallId"] for r in results) == sorted(calls)
            i += 1 + len(calls)
            continue
        i += 1


@pytest.mark.parametrize("name", FILES)
def test_open_in_place_read_only_and_unchanged(pi_dir: Path, tmp_path: Path, name: str) -> None:
    path = pi_dir / name
    digest, size = _sha(path), path.stat().st_size
    s = open_session(str(path), open_store(f"jsonl:{tmp_path}"))
    try:
        assert s.damage == []
        assert s.store.read_only
        n_lines = len(_file_lines(path))
        assert s.store.entry_count() == n_lines - 1  # every line but the header is an entry
        assert s.leaf() == s.store.iter_entries()[-1]["id"]  # the leaf is the last entry
        with pytest.raises(ReadOnlySession):
            s.store.commit([EntryOp({"type": "custom", "id": "x", "parentId": None})])
        ctx = s.context()
        assert ctx.messages
        assert_well_formed(ctx.messages)
    finally:
        s.close()
    assert _sha(path) == digest and path.stat().st_size == size
    assert list(tmp_path.iterdir()) == []  # nothing written next to the store either


@pytest.mark.parametrize("name", V1_FILES)
def test_v1_migration_assigns_ids_and_resolves_compaction_index(pi_dir: Path, name: str) -> None:
    path = pi_dir / name
    raw = _file_lines(path)
    assert "version" not in raw[0] and all("id" not in e for e in raw[1:])
    store = open_pi_file(str(path))
    entries = store.iter_entries()
    assert store.header["version"] == 3 and store.header["migratedFrom"] == 1
    ids = [e["id"] for e in entries]
    assert len(set(ids)) == len(ids) == len(raw) - 1
    assert [e["parentId"] for e in entries] == [None, *ids[:-1]]  # a chain in file order
    for e in entries:
        assert "firstKeptEntryIndex" not in e
    raw_compactions = [e for e in raw if e.get("type") == "compaction"]
    compactions = [e for e in entries if e["type"] == "compaction"]
    assert len(compactions) == len(raw_compactions)
    for mig, orig in zip(compactions, raw_compactions, strict=True):
        # index counts the file's entries with the header as 0, so entry k is ids[k - 1]
        assert mig["firstKeptEntryId"] == ids[orig["firstKeptEntryIndex"] - 1]
    again = open_pi_file(str(path))
    assert [e["id"] for e in again.iter_entries()] == ids  # stable across opens


def test_before_compaction_context_starts_at_last_kept_entry(pi_dir: Path) -> None:
    path = pi_dir / "before-compaction.jsonl"
    raw = _file_lines(path)
    last = [e for e in raw if e.get("type") == "compaction"][-1]
    kept = raw[last["firstKeptEntryIndex"]]
    s = Session(open_pi_file(str(path)))
    ctx = s.context()
    assert ctx.messages[0]["role"] == "user"
    assert last["summary"] in _text(ctx.messages[0])
    assert ctx.messages[1] == kept["message"]
    assert ctx.model == {"provider": "anthropic", "modelId": "claude-opus-4-5"}


def test_v3_branched_context_from_its_leaf(pi_dir: Path) -> None:
    s = Session(open_pi_file(str(pi_dir / "v3-branched.jsonl")))
    raw = {e["id"]: e for e in _file_lines(pi_dir / "v3-branched.jsonl") if "id" in e}
    assert s.leaf() == "a0000011"
    ctx = s.context()
    assert [m["role"] for m in ctx.messages] == [
        "user",
        "user",
        "assistant",
        "toolResult",
        "assistant",
    ]
    assert raw["a000000f"]["summary"] in _text(ctx.messages[0])
    assert ctx.entry_ids == ["a000000f", "a000000b", "a000000d", "a000000e", "a0000010"]
    for msg, eid in zip(ctx.messages[1:], ctx.entry_ids[1:], strict=True):
        assert msg == raw[eid]["message"]
    assert _text(ctx.messages[1]) == "Instead, write a new file summary.md"
    assert ctx.messages[2]["content"][0]["name"] == "write_file"
    assert ctx.messages[3]["toolCallId"] == "call_3"
    assert _text(ctx.messages[4]) == "summary.md is in place."
    assert ctx.model == {"provider": "openai", "modelId": "gpt-5.1"}
    assert ctx.thinking_level == "medium"
    assert s.name == "notes and summary"
    assert s.labels() == {"a0000008": "first-pass"}
    # The abandoned branch is still in the tree, reachable from its own leaf.
    assert [m["role"] for m in s.context("a0000008").messages] == [
        "user",
        "assistant",
        "toolResult",
        "assistant",
        "toolResult",
        "assistant",
    ]


@pytest.mark.parametrize("name", FILES)
def test_import_into_each_backend_gives_the_same_context(
    pi_dir: Path, store: Store, name: str
) -> None:
    path = pi_dir / name
    digest = _sha(path)
    in_place = Session(open_pi_file(str(path)))
    sid = import_pi_file(str(path), store)
    imported = open_session(sid, store)
    try:
        assert imported.store.header["piSessionId"] == in_place.store.header["id"]
        assert imported.leaf() == in_place.leaf()
        assert [e["id"] for e in imported.store.iter_entries()] == [
            e["id"] for e in in_place.store.iter_entries()
        ]
        want, got = in_place.context(), imported.context()
        assert got.messages == want.messages
        assert got.entry_ids == want.entry_ids
        assert (got.model, got.thinking_level) == (want.model, want.thinking_level)
        assert imported.store.records() == []
    finally:
        imported.close()
    assert _sha(path) == digest


def test_v2_hook_message_migrates_to_custom_idempotently(tmp_path: Path) -> None:
    lines = [
        {"type": "session", "version": 2, "id": "s-v2", "timestamp": "t", "cwd": "/w"},
        {"type": "message", "id": "m1", "parentId": None, "timestamp": "t",
         "message": {"role": "user", "content": "hi"}},
        {"type": "message", "id": "m2", "parentId": "m1", "timestamp": "t",
         "message": {"role": "hookMessage", "customType": "hook", "content": "from a hook"}},
        {"type": "message", "id": "m3", "parentId": "m2", "timestamp": "t",
         "message": {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}},
    ]  # fmt: skip
    path = tmp_path / "v2.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = path.read_bytes()

    store = open_pi_file(str(path))
    assert store.damage == []
    assert store.header["migratedFrom"] == 2 and store.header["version"] == 3
    m2 = store.get_entry("m2")
    assert m2 is not None and m2["message"]["role"] == "custom"
    assert m2["message"]["content"] == "from a hook"
    ctx = Session(store).context()
    assert [m["role"] for m in ctx.messages] == ["user", "user", "assistant"]
    assert _text(ctx.messages[1]) == "from a hook"

    parsed, dmg = read_lines(before)
    once = migrate(parsed[0][2], parsed[1:])
    twice = migrate({**parsed[0][2], "version": 3}, [(0, i + 2, e) for i, e in enumerate(once)])
    assert twice == once  # migrating migrated entries changes nothing
    assert migrate(parsed[0][2], parsed[1:]) == once  # and the input was not mutated
    assert dmg == []
    assert [e["id"] for e in open_pi_file(str(path)).iter_entries()] == ["m1", "m2", "m3"]
    assert path.read_bytes() == before
