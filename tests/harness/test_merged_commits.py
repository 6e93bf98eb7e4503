"""Merged commits (issue 22, ``design/run-loop.md`` "Merged commits"): a turn's last settlement,
its save point and the next intent are one commit; an answer whose calls are all replay-safe is
one commit with the first intent, any other answer a commit of its own; an event is sent only
once the store holds what it reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from durable_harness.harness.harness import Harness
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import Store
from durable_harness.storage.base import Op, RecordOp
from durable_harness.tools.base import Replay

from .util import EchoTool, new_session

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


class NeverEcho(EchoTool):
    """``echo`` declared replay ``never``."""

    name: ClassVar[str] = "echo"
    replay: ClassVar[Replay] = "never"


def turns(n: int) -> list[dict[str, Any]]:
    """``n`` turns calling ``echo`` once each, then a final answer."""
    out: list[dict[str, Any]] = [
        {"text": f"step {i}", "tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}]}
        for i in range(n)
    ]
    return [*out, {"text": "done"}]


def counted(session: Session) -> list[list[str]]:
    """Record the record types of every store commit of ``session`` (``entry`` for a commit of
    entries only), one list per commit."""
    commits: list[list[str]] = []
    real = session.store.commit

    def commit(ops: list[Op], *, wait: bool = True) -> int:
        kinds = [op.record["type"] for op in ops if isinstance(op, RecordOp)]
        commits.append(kinds or ["entry"])
        return real(ops, wait=wait)

    session.store.commit = commit  # type: ignore[method-assign]
    return commits


async def test_replay_safe_tool_turns_are_two_commits(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    commits = counted(session)
    async with Harness(session, ScriptedProvider(turns(2)), [EchoTool()], cwd=workdir) as h:
        assert await (await h.prompt("go")).wait() == "completed"
    between = ["tool_finished", "save_point", "provider_request_started"]
    assert commits == [
        ["run_started"],
        ["provider_request_started"],
        ["provider_request_finished", "tool_started"],
        between,
        ["provider_request_finished", "tool_started"],
        between,
        ["provider_request_finished"],
        ["run_finished"],
    ]


async def test_an_answer_calling_a_replay_never_tool_is_its_own_commit(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    commits = counted(session)
    async with Harness(session, ScriptedProvider(turns(1)), [NeverEcho()], cwd=workdir) as h:
        assert await (await h.prompt("go")).wait() == "completed"
    assert commits == [
        ["run_started"],
        ["provider_request_started"],
        ["provider_request_finished"],
        ["tool_started"],
        ["tool_finished", "save_point", "provider_request_started"],
        ["provider_request_finished"],
        ["run_finished"],
    ]


async def test_events_are_sent_once_the_store_holds_what_they_report(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    seen: list[str] = []
    async with Harness(session, ScriptedProvider(turns(2)), [EchoTool()], cwd=workdir) as h:

        def check(event: dict[str, Any]) -> None:
            stored = session.store.records("main")
            if event["type"] == "tool_execution_end":
                assert any(
                    r["type"] == "tool_finished" and r["toolCallId"] == event["toolCallId"]
                    for r in stored
                ), event
            elif event["type"] == "turn_end" and event["turn"] <= 2:
                assert any(
                    r["type"] == "save_point" and r["turn"] == event["turn"] for r in stored
                ), event
            seen.append(str(event["type"]))

        h.subscribe(check)
        assert await (await h.prompt("go")).wait() == "completed"
    assert seen.count("tool_execution_end") == 2
    assert seen.count("turn_end") == 3
    # the held events keep their order: a call's end, its turn's end, the next turn's start
    first_end = seen.index("tool_execution_end")
    assert seen[first_end : first_end + 3] == ["tool_execution_end", "turn_end", "turn_start"]
