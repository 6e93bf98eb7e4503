"""An abort whose signal lands after a request's intent is durable but before its answer
streams (the intent's barrier, in ``batch`` durability) keeps no text: not the previous turn's
answer, not the compaction summary streamed just before ("Settling an abort",
``design/run-loop.md``: the aborted answer is the text streamed *for this request*)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.harness.records import record
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import Store
from durable_harness.storage.base import RecordOp

from .util import EchoTool, of_type

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

LONG = "lorem ipsum dolor sit amet " * 8


def _abort_at_turn_two(h: Harness, seen: list[str]) -> Any:
    """At turn 2's ``turn_start``: what :meth:`Harness.abort` does, its record durable before
    the run writes turn 2's intent, its signal pending when the run awaits that intent's
    barrier (as when the abort's barrier and the intent's share one batch sync)."""

    def on_event(e: dict[str, Any]) -> None:
        if e["type"] == "turn_start" and e.get("turn") == 2 and not seen:
            live = h._core.runs["main"]
            seen.append(live.state.run_id)
            h._core.commit([RecordOp(record("abort_requested", "main", live.state.run_id))], live)
            assert live.scope is not None
            live.scope.cancel()

    return on_event


async def _run(store: Store, workdir: Path, provider: ScriptedProvider, **kw: Any) -> Session:
    session = Session(store.create_session(str(workdir), durability="batch"))
    seen: list[str] = []
    async with Harness(session, provider, [EchoTool()], cwd=workdir, **kw) as h:
        h.subscribe(_abort_at_turn_two(h, seen))
        handle = await h.prompt("go")
        with anyio.fail_after(20):
            assert await handle.wait() == "aborted"
    assert seen, "the second turn never started"
    return session


def _turn_two_answer(session: Session) -> dict[str, Any] | None:
    intents = [
        r
        for r in of_type(session.store.records("main"), "provider_request_started")
        if r.get("purpose") is None
    ]
    assert [r["turn"] for r in intents] == [1, 2]
    return session.store.get_entry(intents[1]["responseEntryId"])


async def test_an_abort_at_the_next_intent_keeps_no_text_of_the_last_answer(
    store: Store, workdir: Path
) -> None:
    turns = [
        {"text": "FIRST ANSWER", "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]},
        {"text": "second answer"},
    ]
    session = await _run(store, workdir, ScriptedProvider(turns))
    assert _turn_two_answer(session) is None  # nothing streamed for turn 2: no answer


async def test_an_abort_after_a_compaction_keeps_no_summary_as_the_answer(
    store: Store, workdir: Path
) -> None:
    turns = [
        {"text": f"big: {LONG}", "tool_calls": [{"name": "echo", "arguments": {"text": LONG}}]},
        {"text": "finished"},
    ]
    opts = HarnessOptions(compact_reserve=150, keep_recent_tokens=50)
    provider = ScriptedProvider(turns, context_window=300)
    session = await _run(store, workdir, provider, options=opts)
    assert len(session.store.iter_entries(("compaction",))) == 1
    assert _turn_two_answer(session) is None
