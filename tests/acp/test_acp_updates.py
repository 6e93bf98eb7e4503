"""The event and transcript translations on their own (``durable_harness.acp.updates``)."""

from __future__ import annotations

from typing import Any

from durable_harness.acp.updates import EventTranslator, replay, tool_title


def dumped(updates: list[Any]) -> list[dict[str, Any]]:
    return [u.model_dump(mode="json", by_alias=True, exclude_none=True) for u in updates]


def test_thinking_streams_as_thought_chunks_and_summaries_are_not_shown() -> None:
    tr = EventTranslator("/w", lambda _id: None)
    out = dumped(
        tr.feed({"type": "message_update", "thinking": "hmm", "runId": "r"})
        + tr.feed({"type": "message_update", "delta": "Hi", "purpose": "turn", "runId": "r"})
        + tr.feed({"type": "message_update", "delta": "sum", "purpose": "compaction"})
    )
    assert out == [
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hi"}},
    ]


def test_a_cut_answer_is_remembered_for_the_stop_reason() -> None:
    tr = EventTranslator("/w", lambda _id: None)
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "x"}],
        "stopReason": "length",
    }
    assert tr.feed({"type": "message_end", "message": message, "runId": "r"}) == []
    assert tr.stop_reasons["r"] == "length"


def test_replay_rebuilds_thinking_text_calls_and_results() -> None:
    entries = [
        {"type": "model_change", "provider": "x"},
        {"type": "message", "message": {"role": "user", "content": "plain"}},
        {
            "type": "message",
            "message": {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan"},
                    {"type": "text", "text": "ok"},
                    {
                        "type": "toolCall",
                        "id": "c1",
                        "name": "bash",
                        "arguments": {"command": "ls"},
                    },
                ],
            },
        },
        {
            "type": "message",
            "message": {
                "role": "toolResult",
                "toolCallId": "c1",
                "isError": True,
                "content": [{"type": "text", "text": "boom"}],
            },
        },
    ]
    kinds = [(u["sessionUpdate"], u.get("status")) for u in dumped(replay("/w", entries))]
    assert kinds == [
        ("user_message_chunk", None),
        ("agent_thought_chunk", None),
        ("agent_message_chunk", None),
        ("tool_call", "pending"),
        ("tool_call_update", "failed"),
    ]


def test_titles_are_one_line_and_bounded() -> None:
    assert tool_title("bash", {"command": "echo a\n  && echo b"}) == "bash: echo a && echo b"
    assert tool_title("read_file", {"path": "a.txt"}) == "read_file: a.txt"
    assert tool_title("custom", {}) == "custom"
    assert len(tool_title("bash", {"command": "x" * 500})) == 120
