"""The operation log of one scripted run, record by record, and the commits that hold it.

The expected sequence is data (``EXPECTED``): it is the write order ``design/run-loop.md``
describes for a run of three turns (a parallel batch of two tool calls, one tool call, a final
answer) with a steering message accepted right after the prompt.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.harness.harness import Harness
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.storage import Store
from durable_harness.tools.base import ToolResult

from .util import (
    EchoArgs,
    EchoTool,
    assert_same_commit,
    collect_events,
    messages_on_path,
    new_session,
    of_type,
    one_result_per_call,
    types_of,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

TURNS: list[dict[str, Any]] = [
    {
        "text": "Looking at both.",
        "tool_calls": [
            {"name": "echo", "arguments": {"text": "a"}},
            {"name": "echo", "arguments": {"text": "b"}},
        ],
        "usage": {"input": 10, "output": 5},
    },
    {
        "text": "One more.",
        "tool_calls": [{"name": "echo", "arguments": {"text": "c"}}],
        "usage": {"input": 20, "output": 5},
    },
    {"text": "All done.", "usage": {"input": 30, "output": 3}},
]

# (type, fields that record must carry). Tool records of turn 1: the echo tool never awaits,
# so each call's intent and settlement are written back to back; which of the two calls goes
# first is the scheduler's choice (trio shuffles), so the ids are checked apart from this list.
EXPECTED: list[tuple[str, dict[str, Any]]] = [
    ("run_started", {}),
    ("queue_enqueued", {"queue": "steer"}),
    ("provider_request_started", {"turn": 1, "attempt": 1}),
    ("provider_request_finished", {"turn": 1, "attempt": 1, "stopReason": "toolUse"}),
    ("tool_started", {"toolName": "echo", "replay": "safe", "attempt": 1}),
    ("tool_finished", {"outcome": "ok", "isError": False}),
    ("tool_started", {"toolName": "echo", "replay": "safe", "attempt": 1}),
    ("tool_finished", {"outcome": "ok", "isError": False}),
    ("queue_consumed", {"queue": "steer"}),
    ("save_point", {"turn": 1}),
    ("provider_request_started", {"turn": 2, "attempt": 1}),
    ("provider_request_finished", {"turn": 2, "attempt": 1, "stopReason": "toolUse"}),
    ("tool_started", {"toolName": "echo", "replay": "safe", "attempt": 1}),
    ("tool_finished", {"outcome": "ok", "isError": False}),
    ("save_point", {"turn": 2}),
    ("provider_request_started", {"turn": 3, "attempt": 1}),
    ("provider_request_finished", {"turn": 3, "attempt": 1, "stopReason": "stop"}),
    ("run_finished", {"outcome": "completed"}),
]


async def _run(store: Store, workdir: Path) -> tuple[Any, Any, list[dict[str, Any]], str, str]:
    session = new_session(store, workdir)
    provider = ScriptedProvider(TURNS)
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        events, _ = collect_events(h)
        handle = await h.prompt("check a and b")
        item = await h.steer("also mind c")
        assert await handle.wait() == "completed"
    return session, handle, events, item, handle.run_id


async def test_record_sequence_matches_the_run_loop(store: Store, workdir: Path) -> None:
    session, _, _, item_id, run_id = await _run(store, workdir)
    recs = session.store.records("main")
    assert types_of(recs) == [t for t, _ in EXPECTED]
    for i, (rec, (rtype, fields)) in enumerate(zip(recs, EXPECTED, strict=True)):
        assert rec["type"] == rtype, i
        for key, value in fields.items():
            assert rec.get(key) == value, (i, rtype, key, rec.get(key))
        assert rec["lane"] == "main"
        if rtype != "queue_enqueued":
            assert rec.get("runId") == run_id, (i, rtype)
        assert rec.get("id") and rec.get("timestamp")
    seqs = [r["seq"] for r in recs]
    assert all(a < b for a, b in itertools.pairwise(seqs)), seqs
    assert len({r["id"] for r in recs}) == len(recs)

    # The steer receipt carries the full payload; its consumption names the same item.
    enq = of_type(recs, "queue_enqueued")[0]
    assert enq["itemId"] == item_id
    assert enq["message"]["content"][0]["text"] == "also mind c"
    assert of_type(recs, "queue_consumed")[0]["itemIds"] == [item_id]

    # Each turn-1 tool intent is followed by its own settlement; both calls ran once each.
    turn1_tools = recs[4:8]
    assert turn1_tools[0]["toolCallId"] == turn1_tools[1]["toolCallId"]
    assert turn1_tools[2]["toolCallId"] == turn1_tools[3]["toolCallId"]
    assistant1 = session.store.get_entry(recs[3]["entryId"])["message"]
    call_ids = [b["id"] for b in assistant1["content"] if b["type"] == "toolCall"]
    assert {turn1_tools[0]["toolCallId"], turn1_tools[2]["toolCallId"]} == set(call_ids)
    for started in of_type(recs, "tool_started"):
        assert started["idempotencyKey"] == f"{run_id}:{started['callKey']}"


async def test_provisioned_ids_are_used_and_settlements_share_a_commit(
    store: Store, workdir: Path
) -> None:
    session, _, _, _, _run_id = await _run(store, workdir)
    recs = session.store.records("main")
    get = session.store.get_entry

    # The prompt entry and run_started: one commit.
    started = of_type(recs, "run_started")[0]
    prompt_entry = get(started["promptEntryId"])
    assert prompt_entry is not None
    assert prompt_entry["message"]["role"] == "user"
    assert prompt_entry["message"]["content"][0]["text"] == "check a and b"
    assert started["prompt"]["content"] == prompt_entry["message"]["content"]
    assert_same_commit(session, prompt_entry["seq"], started["seq"])

    # Every provider intent names the assistant entry its settlement stores, in one commit.
    intents = of_type(recs, "provider_request_started")
    settled = of_type(recs, "provider_request_finished")
    assert len(intents) == len(settled) == 3
    for intent, fin in zip(intents, settled, strict=True):
        entry = get(intent["responseEntryId"])
        assert entry is not None, intent
        assert fin["entryId"] == intent["responseEntryId"] == entry["id"]
        assert entry["message"]["role"] == "assistant"
        assert fin["usage"] == entry["message"]["usage"]
        assert intent["seq"] < entry["seq"]
        assert_same_commit(session, entry["seq"], fin["seq"])

    # Every tool intent names the result entry its settlement stores, in one commit.
    t_started = of_type(recs, "tool_started")
    t_finished = {r["toolCallId"]: r for r in of_type(recs, "tool_finished")}
    assert len(t_started) == len(t_finished) == 3
    for intent in t_started:
        fin = t_finished[intent["toolCallId"]]
        entry = get(intent["resultEntryId"])
        assert entry is not None, intent
        assert fin["resultEntryId"] == entry["id"]
        assert entry["message"]["role"] == "toolResult"
        assert entry["message"]["toolCallId"] == intent["toolCallId"]
        assert intent["seq"] < entry["seq"]
        assert_same_commit(session, entry["seq"], fin["seq"])

    # The steer message is delivered in the save point's commit.
    consumed = of_type(recs, "queue_consumed")[0]
    save1 = of_type(recs, "save_point")[0]
    delivered = save1["deliveredEntries"]
    assert len(delivered) == 1
    steer_entry = get(delivered[0])
    assert steer_entry["message"]["content"][0]["text"] == "also mind c"
    assert_same_commit(session, steer_entry["seq"], consumed["seq"], save1["seq"])
    assert of_type(recs, "save_point")[1]["deliveredEntries"] == []


async def test_tree_and_context_shape(store: Store, workdir: Path) -> None:
    session, _, _, _, _ = await _run(store, workdir)
    path = messages_on_path(session)
    shape = [(e["message"]["role"], e["message"].get("toolName")) for e in path]
    assert shape == [
        ("user", None),
        ("assistant", None),
        ("toolResult", "echo"),
        ("toolResult", "echo"),
        ("user", None),  # the steer, after the turn-1 results and before the turn-2 answer
        ("assistant", None),
        ("toolResult", "echo"),
        ("assistant", None),
    ]
    assert path[4]["message"]["content"][0]["text"] == "also mind c"
    results = {e["message"]["toolCallId"]: e for e in path if e["message"]["role"] == "toolResult"}
    texts = sorted(e["message"]["content"][0]["text"] for e in results.values())
    assert texts == ["echo: a", "echo: b", "echo: c"]
    assert not any(e["message"]["isError"] for e in results.values())

    ctx = session.context()
    one_result_per_call(ctx.messages)
    assert [m["role"] for m in ctx.messages] == [role for role, _ in shape]
    assert ctx.messages[-1]["content"] == [{"type": "text", "text": "All done."}]
    assert session.lane("main").run_id is None
    assert session.leaf() == path[-1]["id"]


async def test_events_in_order(store: Store, workdir: Path) -> None:
    _, _, events, item_id, run_id = await _run(store, workdir)
    kinds = [e["type"] for e in events]
    # The steer was accepted before the driver took its first step.
    assert kinds[0] == "queue_update" and events[0]["itemId"] == item_id
    run_events = events[1:]
    assert all(e["runId"] == run_id and e["lane"] == "main" for e in run_events)
    assert run_events[0]["type"] == "run_start"
    assert run_events[-1]["type"] == "run_end"
    assert run_events[-1]["outcome"] == "completed"
    assert kinds.count("run_start") == kinds.count("run_end") == 1

    # Split into turns and check each one's shape.
    turns: list[list[str]] = []
    for e in run_events[1:-1]:
        if e["type"] == "turn_start":
            turns.append([])
        turns[-1].append(e["type"])
    assert len(turns) == 3
    for index, turn in enumerate(turns):
        assert turn[0] == "turn_start" and turn[-1] == "turn_end"
        body = turn[1:-1]
        assert body[:2] == ["provider_request_start", "message_start"]
        end = body.index("message_end")
        assert set(body[2:end]) == {"message_update"} and end > 2
        assert body[end + 1] == "provider_request_end"
        tools = body[end + 2 :]
        n_calls = [2, 1, 0][index]
        assert tools.count("tool_execution_start") == tools.count("tool_execution_end") == n_calls
        for k, kind in enumerate(tools):
            if kind == "tool_execution_end":
                assert "tool_execution_start" in tools[:k]
    turn_nums = [e["turn"] for e in run_events if e["type"] in ("turn_start", "turn_end")]
    assert turn_nums == [1, 1, 2, 2, 3, 3]
    ends = [e for e in run_events if e["type"] == "message_end"]
    assert [e["message"]["stopReason"] for e in ends] == ["toolUse", "toolUse", "stop"]
    requests = [e for e in run_events if e["type"] == "provider_request_end"]
    assert [(e["turn"], e["attempt"], e["outcome"]) for e in requests] == [
        (1, 1, "ok"),
        (2, 1, "ok"),
        (3, 1, "ok"),
    ]
    assert [e["usage"] for e in requests] == [e["message"]["usage"] for e in ends]


class GateTool(EchoTool):
    """``echo`` whose calls each wait until every call of the batch has begun: proves the
    batch runs in parallel (a sequential batch would deadlock and time out)."""

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.everyone = anyio.Event()

    async def execute(self, args: Any, ctx: Any) -> Any:
        assert isinstance(args, EchoArgs)
        self.calls.append(ctx.tool_call_id)
        if len(self.calls) == self.expected:
            self.everyone.set()
        with anyio.fail_after(5):
            await self.everyone.wait()
        return ToolResult.text(f"echo: {args.text}")


async def test_parallel_batch_writes_both_intents_before_any_settlement(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    tool = GateTool(expected=2)
    async with Harness(session, ScriptedProvider([TURNS[0], TURNS[2]]), [tool], cwd=workdir) as h:
        handle = await h.prompt("go")
        assert await handle.wait() == "completed"
    recs = session.store.records("main")
    types = types_of(recs)
    first = types.index("tool_started")
    assert types[first : first + 4] == ["tool_started", "tool_started"] + ["tool_finished"] * 2
    assert len(set(tool.calls)) == 2
    one_result_per_call(session.context().messages)
