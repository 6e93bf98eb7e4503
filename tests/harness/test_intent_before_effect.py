"""Write-ahead, checked from outside: when a tool's effect begins, a second reader opening the
session from disk already finds the ``tool_started`` intent (:func:`assert_intent_durable`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from durable_harness.harness.harness import Harness
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.storage import Store
from durable_harness.tools.base import Replay, Tool, ToolContext, ToolResult

from .util import EchoArgs, assert_intent_durable, new_session, of_type, one_result_per_call

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


class IntentProbe(Tool):
    """A tool whose effect first checks, from a fresh read-only open of the session on disk,
    that its own intent is stored; failures are kept and re-raised by the test (the harness
    would turn an exception into an error result)."""

    name: ClassVar[str] = "probe"
    description: ClassVar[str] = "Checks its own intent is durable, then echoes."
    Args: ClassVar[type[BaseModel]] = EchoArgs
    replay: ClassVar[Replay] = "never"

    def __init__(self, location: str) -> None:
        self.location = location
        self.seen: dict[str, dict[str, Any]] = {}
        self.errors: list[BaseException] = []

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        try:
            self.seen[ctx.tool_call_id] = assert_intent_durable(self.location, ctx.tool_call_id)
        except BaseException as exc:
            self.errors.append(exc)
            raise
        return ToolResult.text(f"probed {args.text}")


async def test_intent_is_durable_before_each_effect(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    probe = IntentProbe(session.store.location)
    turns = [
        {
            "text": "probing twice",
            "tool_calls": [
                {"name": "probe", "arguments": {"text": "one"}},
                {"name": "probe", "arguments": {"text": "two"}},
            ],
        },
        {"text": "probing again", "tool_calls": [{"name": "probe", "arguments": {"text": "3"}}]},
        {"text": "done"},
    ]
    async with Harness(session, ScriptedProvider(turns), [probe], cwd=workdir) as h:
        handle = await h.prompt("probe")
        assert await handle.wait() == "completed"
    if probe.errors:
        raise probe.errors[0]
    recs = session.store.records("main")
    started = of_type(recs, "tool_started")
    assert len(probe.seen) == len(started) == 3
    for rec in started:
        seen = probe.seen[rec["toolCallId"]]
        assert seen["id"] == rec["id"] and seen["seq"] == rec["seq"]
        assert seen["replay"] == "never"
        assert seen["resultEntryId"] == rec["resultEntryId"]
    results = [r for r in of_type(recs, "tool_finished")]
    assert all(not r["isError"] for r in results)
    one_result_per_call(session.context().messages)


async def test_helper_fails_when_no_intent_is_stored(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    async with Harness(session, ScriptedProvider([{"text": "hi"}]), [], cwd=workdir) as h:
        handle = await h.prompt("hello")
        await handle.wait()
    with pytest.raises(AssertionError, match="no durable tool_started"):
        assert_intent_durable(session.store.location, "call_that_never_was")


async def test_helper_fails_once_the_call_is_settled(store: Store, workdir: Path) -> None:
    """Called after the effect, the helper refuses: it checks the state *before* settlement."""
    session = new_session(store, workdir)
    turns = [{"text": "t", "tool_calls": [{"name": "probe", "arguments": {"text": "x"}}]}]
    probe = IntentProbe(session.store.location)
    async with Harness(session, ScriptedProvider(turns), [probe], cwd=workdir) as h:
        handle = await h.prompt("hello")
        await handle.wait()
    assert not probe.errors
    (call_id,) = probe.seen
    with pytest.raises(AssertionError, match="tool_finished"):
        assert_intent_durable(session.store.location, call_id)
