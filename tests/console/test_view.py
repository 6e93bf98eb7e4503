"""What the session page shows from entries (``durable_harness/console/view.py``)."""

from __future__ import annotations

from typing import Any

from durable_harness.console.view import transcript
from durable_harness.harness.report import cost_summary, format_cost
from durable_harness.host.read_model import SessionView, last_activity


def msg(eid: str, parent: str | None, role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": eid,
        "parentId": parent,
        "timestamp": f"2026-01-31T12:00:0{len(eid) % 10}.000Z",
        "message": {"role": role, "content": content, **extra},
    }


def cost(total: float) -> dict[str, Any]:
    return {"usage": {"cost": {"total": total}}}


def test_calls_meet_their_results_and_markers_are_kept() -> None:
    call = {"type": "toolCall", "id": "t1", "name": "read", "arguments": {"path": "a.txt"}}
    other = {"type": "toolCall", "id": "t2", "name": "bash", "arguments": {"command": "ls"}}
    path = [
        msg("u1", None, "user", "look"),
        msg("a1", "u1", "assistant", [{"type": "text", "text": "reading"}, call, other]),
        msg("r1", "a1", "toolResult", [{"type": "text", "text": "hello"}], toolCallId="t1"),
        {"type": "branch_summary", "id": "b1", "parentId": "r1", "summary": "tried X"},
        {
            "type": "compaction",
            "id": "c1",
            "parentId": "b1",
            "summary": "so far",
            "tokensBefore": 9,
        },
        {"type": "model_change", "id": "m1", "parentId": "c1", "provider": "p", "modelId": "m"},
    ]
    sibling = msg("u2", "u1", "assistant", "another branch")
    items = transcript(path, [*path, sibling])
    assert [i.kind for i in items] == ["user", "assistant", "branch", "compaction", "note"]
    assert items[0].branches == 2  # u1 has two children: a branch point
    read, bash = items[1].calls
    assert (read.name, read.result, read.pending) == ("read", "hello", False)
    assert '"path": "a.txt"' in read.arguments
    assert bash.pending and bash.result is None  # no result on the path: shown as pending
    assert items[2].text == "tried X"
    assert items[3].meta == "9 tokens before"
    assert items[4].text == "model: p/m"


def test_cost_is_the_cli_computation_and_unknown_is_not_zero() -> None:
    """The console's cost is ``cost_summary``'s total (what ``durable-harness cost``
    prints): assistant messages only, every branch; a message without a known cost makes
    the sum unknown, shown as "at least" the known part (issue 20)."""
    entries = [
        msg("u1", None, "user", "hi", **cost(5.0)),
        msg("a1", "u1", "assistant", "x", **cost(0.25)),
        msg("a2", "u1", "assistant", "y", **cost(0.5)),  # another branch: still spent
    ]
    known = SessionView(entries, [], {}, {}).cost
    assert known["cost"] == 0.75 and format_cost(known, 4) == "$0.7500"
    unknown = [
        msg("a3", "a2", "assistant", "z"),  # no usage
        msg("a4", "a3", "assistant", "w", usage={"cost": {"total": "bad"}}),
        msg("a5", "a4", "assistant", "v", usage={"totalTokens": 9, "cost": None}),
    ]
    view = SessionView([*entries, *unknown], [], {}, {})
    assert view.cost == {
        "tokens": 9,
        "cost": None,
        "known_cost": 0.75,
        "unknown_cost_turns": 3,
    }
    assert view.cost == cost_summary([], lambda: [*entries, *unknown])["total"]
    assert format_cost(view.cost, 4) == "≥ $0.7500 (3 unknown)"
    assert format_cost(SessionView(unknown, [], {}, {}).cost) == "unknown"
    assert format_cost(SessionView([], [], {}, {}).cost) == "$0.000000"


def test_last_activity_is_the_latest_timestamp() -> None:
    entries = [{"timestamp": "2026-01-31T12:00:00.000Z"}]
    records = [{"timestamp": "2026-01-31T12:00:05.000Z"}, {"timestamp": "garbage"}]
    assert last_activity(entries, records) == "2026-01-31T12:00:05.000Z"
    assert last_activity([], []) is None
