"""``build_context``: a pure function of (entry getter, leaf id), tested on plain dict entries."""

from __future__ import annotations

from typing import Any

from durable_harness.session.context import INTERRUPTED_TEXT, build_context, path_to


class Tree:
    """Entries chained in insertion order (each under the previous one unless told)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.last: str | None = None

    def add(self, eid: str, etype: str, *, parent: str | bool | None = True, **fields: Any) -> str:
        parent_id = self.last if parent is True else parent
        self.entries[eid] = {"type": etype, "id": eid, "parentId": parent_id, **fields}
        self.last = eid
        return eid

    def msg(self, eid: str, role: str, content: Any = None, **fields: Any) -> str:
        message = {"role": role, **fields}
        if content is not None:
            message["content"] = content
        return self.add(eid, "message", message=message)

    def user(self, eid: str, text: str) -> str:
        return self.msg(eid, "user", [{"type": "text", "text": text}])

    def assistant(self, eid: str, text: str = "", calls: tuple[str, ...] = (), **f: Any) -> str:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "toolCall", "id": c, "name": "bash", "arguments": {}} for c in calls]
        return self.msg(eid, "assistant", content, **f)

    def result(self, eid: str, call: str, text: str = "ok") -> str:
        return self.msg(
            eid, "toolResult", [{"type": "text", "text": text}], toolCallId=call, toolName="bash"
        )

    def context(self, leaf: str | None = None) -> Any:
        return build_context(self.entries.get, self.last if leaf is None else leaf)


def texts(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        else:
            out.append("".join(b.get("text", "") for b in content if b.get("type") == "text"))
    return out


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def test_linear_path() -> None:
    t = Tree()
    t.user("u1", "hello")
    t.assistant("a1", "hi there")
    t.user("u2", "again")
    ctx = t.context()
    assert roles(ctx.messages) == ["user", "assistant", "user"]
    assert texts(ctx.messages) == ["hello", "hi there", "again"]
    assert ctx.entry_ids == ["u1", "a1", "u2"]
    # From an inner leaf, only the path up to it.
    assert texts(t.context("a1").messages) == ["hello", "hi there"]
    assert build_context(t.entries.get, None).messages == []
    assert [e["id"] for e in path_to(t.entries.get, "u2")] == ["u1", "a1", "u2"]


def test_only_the_leafs_branch_is_used() -> None:
    t = Tree()
    t.user("u1", "root")
    t.assistant("a1", "answer one")
    t.user("u2", "abandoned")
    t.add("u3", "message", parent="a1", message={"role": "user", "content": "other branch"})
    assert texts(t.context("u3").messages) == ["root", "answer one", "other branch"]
    assert texts(t.context("u2").messages) == ["root", "answer one", "abandoned"]


def test_last_compaction_wins_with_first_kept_entry() -> None:
    t = Tree()
    t.user("u1", "one")
    t.assistant("a1", "reply one")
    t.user("u2", "two")
    t.assistant("a2", "reply two")
    t.add("c1", "compaction", summary="FIRST SUMMARY", firstKeptEntryId="u2")
    t.user("u3", "three")
    t.assistant("a3", "reply three")
    t.add("c2", "compaction", summary="SECOND SUMMARY", firstKeptEntryId="u3")
    t.user("u4", "four")
    ctx = t.context()
    assert roles(ctx.messages) == ["user", "user", "assistant", "user"]
    summary, *rest = texts(ctx.messages)
    assert "SECOND SUMMARY" in summary and "FIRST SUMMARY" not in summary
    assert rest == ["three", "reply three", "four"]
    assert ctx.entry_ids == ["c2", "u3", "a3", "u4"]

    # From a leaf before the second compaction, the first one applies.
    ctx = t.context("a3")
    summary, *rest = texts(ctx.messages)
    assert "FIRST SUMMARY" in summary
    assert rest == ["two", "reply two", "three", "reply three"]


def test_branch_summary_and_custom_message_are_user_role() -> None:
    t = Tree()
    t.user("u1", "start")
    t.add("b1", "branch_summary", fromId="x", summary="we tried X and it failed")
    t.add("cm", "custom_message", customType="ext", content="extension says hi")
    t.msg("cu", "custom", "custom role text", customType="ext")
    t.msg("hk", "hookMessage", "hook text")
    t.add("ce", "custom", customType="state", data={"k": 1})  # no message
    t.add("lb", "label", targetId="u1", label="start")
    t.add("si", "session_info", name="n")
    ctx = t.context()
    assert roles(ctx.messages) == ["user"] * 5
    got = texts(ctx.messages)
    assert got[0] == "start"
    assert "we tried X and it failed" in got[1]
    assert got[2:] == ["extension says hi", "custom role text", "hook text"]
    assert ctx.entry_ids == ["u1", "b1", "cm", "cu", "hk"]


def test_bash_execution_becomes_user_text() -> None:
    t = Tree()
    t.msg("b1", "bashExecution", command="ls -la", output="file.txt", exitCode=0)
    t.msg("b2", "bashExecution", command="false", output="", exitCode=1)
    ctx = t.context()
    assert roles(ctx.messages) == ["user", "user"]
    first, second = texts(ctx.messages)
    assert "ls -la" in first and "file.txt" in first
    assert "false" in second and "exit code 1" in second
    assert all(b["type"] == "text" for m in ctx.messages for b in m["content"])


def test_empty_assistant_is_dropped() -> None:
    t = Tree()
    t.user("u1", "q")
    t.assistant("a0")  # no content at all
    t.msg("a1", "assistant", [{"type": "text", "text": "   "}])
    t.msg("a2", "assistant", [{"type": "thinking", "thinking": "hmm"}])
    t.assistant("a3", "real answer")
    ctx = t.context()
    assert ctx.entry_ids == ["u1", "a3"]
    assert texts(ctx.messages) == ["q", "real answer"]


def test_tool_call_without_result_gets_interrupted_result() -> None:
    t = Tree()
    t.user("u1", "do it")
    t.assistant("a1", "running", calls=("call_a", "call_b"))
    t.result("r1", "call_a", "done a")
    ctx = t.context()
    assert roles(ctx.messages) == ["user", "assistant", "toolResult", "toolResult"]
    real, synthetic = ctx.messages[2], ctx.messages[3]
    assert real["toolCallId"] == "call_a" and texts([real]) == ["done a"]
    assert "interrupted" not in real
    assert synthetic["toolCallId"] == "call_b"
    assert synthetic["toolName"] == "bash"
    assert synthetic["interrupted"] is True
    assert synthetic["isError"] is True
    assert texts([synthetic]) == [INTERRUPTED_TEXT]
    assert ctx.entry_ids[3] is None


def test_call_at_the_leaf_and_call_followed_by_user_get_synthetic_results() -> None:
    t = Tree()
    t.assistant("a1", calls=("c1",))
    t.user("u1", "interrupting")
    t.result("r1", "c1")  # arrives after the user message: no longer next to its call
    t.assistant("a2", calls=("c2",))
    ctx = t.context()
    assert roles(ctx.messages) == ["assistant", "toolResult", "user", "assistant", "toolResult"]
    assert [m.get("interrupted") for m in ctx.messages if m["role"] == "toolResult"] == [
        True,
        True,
    ]


def test_result_without_call_is_dropped() -> None:
    t = Tree()
    t.user("u1", "q")
    t.result("r0", "ghost")  # no assistant before it
    t.assistant("a1", "answer", calls=("c1",))
    t.result("r1", "c1")
    t.result("r2", "not-called")  # right after the call's result, but for another id
    ctx = t.context()
    assert roles(ctx.messages) == ["user", "assistant", "toolResult"]
    assert ctx.messages[2]["toolCallId"] == "c1"
    assert "r0" not in ctx.entry_ids and "r2" not in ctx.entry_ids


def test_two_results_for_one_call_keep_exactly_one() -> None:
    t = Tree()
    t.assistant("a1", calls=("c1", "c2"))
    t.result("r2", "c2", "second call")  # out of order: reordered to follow the calls
    t.result("r1a", "c1", "first result")
    t.result("r1b", "c1", "duplicate result")
    ctx = t.context()
    results = [m for m in ctx.messages if m["role"] == "toolResult"]
    assert [m["toolCallId"] for m in results] == ["c1", "c2"]
    assert texts(results) == ["first result", "second call"]
    assert ctx.entry_ids == ["a1", "r1a", "r2"]


def test_settings_come_from_the_whole_path() -> None:
    t = Tree()
    ctx = t.context()
    assert (ctx.model, ctx.thinking_level) == (None, "off")
    t.add("m1", "model_change", provider="anthropic", modelId="claude-a")
    t.add("t1", "thinking_level_change", thinkingLevel="high")
    t.user("u1", "q")
    assert t.context().model == {"provider": "anthropic", "modelId": "claude-a"}
    assert t.context().thinking_level == "high"
    t.assistant("a1", "answer", provider="openai", model="gpt-x")
    assert t.context().model == {"provider": "openai", "modelId": "gpt-x"}
    # Settings before a compaction still count, even though their messages are summarised.
    t.add("c1", "compaction", summary="s", firstKeptEntryId="a1")
    t.user("u2", "more")
    ctx = t.context()
    assert ctx.model == {"provider": "openai", "modelId": "gpt-x"}
    assert ctx.thinking_level == "high"
    t.add("m2", "model_change", provider="anthropic", modelId="claude-b")
    t.add("t2", "thinking_level_change", thinkingLevel="low")
    ctx = t.context()
    assert ctx.model == {"provider": "anthropic", "modelId": "claude-b"}
    assert ctx.thinking_level == "low"
    # Setting entries contribute no message.
    assert roles(ctx.messages) == ["user", "assistant", "user"]
    # An earlier leaf sees the earlier settings.
    assert t.context("u1").model == {"provider": "anthropic", "modelId": "claude-a"}


def test_missing_parent_ends_the_walk_and_cycles_terminate() -> None:
    t = Tree()
    t.add("x", "message", parent="gone", message={"role": "user", "content": "orphan"})
    t.user("y", "child")
    assert texts(t.context().messages) == ["orphan", "child"]
    t.entries["x"]["parentId"] = "y"  # a cycle cannot hang the walk
    assert sorted(texts(t.context().messages)) == ["child", "orphan"]
