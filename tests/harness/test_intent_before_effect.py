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
from durable_harness.testing import assert_intent_durable
from durable_harness.tools.base import Replay, Tool, ToolContext, ToolResult

from .util import EchoArgs, new_session, of_type, one_result_per_call

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


class FsyncProbe(Tool):
    """A tool whose effect records the last seq the latest fsync covered."""

    name: ClassVar[str] = "fsync_probe"
    description: ClassVar[str] = "Records the fsync horizon when its effect begins."
    Args: ClassVar[type[BaseModel]] = EchoArgs
    replay: ClassVar[Replay] = "never"

    def __init__(self, horizon: list[int]) -> None:
        self.horizon = horizon
        self.at_effect: list[int] = []

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        self.at_effect.append(self.horizon[-1] if self.horizon else -1)
        return ToolResult.text("ok")


@pytest.mark.parametrize("durability", ["sync", "batch"])
async def test_intent_is_fsynced_before_the_effect(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """Not only written: an fsync that started after the tool_started commit has returned
    before the tool's effect starts (both backends fsync with ``os.fdatasync``: the JSONL file
    or SQLite's WAL; settlements may ride on a later fsync)."""
    import os

    from durable_harness.session import Session

    session_store = store.create_session(str(tmp_path), durability=durability)  # type: ignore[arg-type]
    horizon: list[int] = []  # per fsync: the last seq committed when it started
    real = os.fdatasync

    def recording(fd: int) -> None:
        covered = session_store.last_seq()
        real(fd)
        horizon.append(covered)

    monkeypatch.setattr(os, "fdatasync", recording)
    session = Session(session_store)
    probe = FsyncProbe(horizon)
    turns = [
        {"text": "t1", "tool_calls": [{"name": "fsync_probe", "arguments": {"text": "a"}}]},
        {"text": "t2", "tool_calls": [{"name": "fsync_probe", "arguments": {"text": "b"}}]},
        {"text": "done"},
    ]
    async with Harness(session, ScriptedProvider(turns), [probe], cwd=tmp_path) as h:
        run = await h.prompt("go")
        assert await run.wait() == "completed"
    started = [r for r in session.store.records("main") if r["type"] == "tool_started"]
    assert len(started) == 2 and len(probe.at_effect) == 2
    for rec, covered in zip(started, probe.at_effect, strict=True):
        assert covered >= rec["seq"], f"intent {rec['id']} not fsynced before its effect"
    # and everything is durable once the run has settled
    assert horizon[-1] == session_store.last_seq()
    session.close()
