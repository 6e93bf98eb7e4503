"""A run's stop cause is a typed field: the harness writes ``run_finished.limit`` when a limit
fails the run, and the ACP agent maps ``max_turns`` to ``max_turn_requests`` from that field,
never from the words of ``reason``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from acp import RequestError

from durable_harness.acp.agent import DurableAgent, _RunEnd
from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools


class _Manager:
    """The one read the stop reason makes: the lane's log page."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def log(self, session_id: str, lane: str, limit: int) -> dict[str, Any]:
        return {"records": self.records}


def _stop(finished: dict[str, Any]) -> str:
    agent = DurableAgent()
    record = {"type": "run_finished", "runId": "r1", "outcome": "failed"} | finished
    agent.manager = _Manager([record])  # type: ignore[assignment]
    return agent.stop_reason("s1", "r1", _RunEnd(outcome="failed"))


def test_the_max_turns_limit_is_max_turn_requests() -> None:
    assert _stop({"reason": "the run took its turns", "limit": "max_turns"}) == "max_turn_requests"


@pytest.mark.parametrize(
    "finished",
    [
        {"reason": "max_turns 50 reached"},  # the words alone are no stop cause
        {"reason": "max_tool_calls 5 reached", "limit": "max_tool_calls"},
        {"reason": "attempt cap reached", "limit": "attempt_cap"},
    ],
)
def test_any_other_failure_is_a_run_failed_error(finished: dict[str, Any]) -> None:
    with pytest.raises(RequestError) as exc:
        _stop(finished)
    assert exc.value.data == {"code": "run_failed", "runId": "r1", "reason": finished["reason"]}


def test_the_harness_records_the_limit_that_failed_the_run(tmp_path: Path) -> None:
    turn = {"text": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]}
    opts = HarnessOptions(max_turns=1)

    async def go() -> list[dict[str, Any]]:
        with Session(open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path))) as s:
            provider = ScriptedProvider([turn, turn])
            async with Harness(s, provider, builtin_tools(), options=opts) as h:
                assert await (await h.prompt("go")).wait() == "failed"
            return s.store.records("main", types=("run_finished",))

    (finished,) = anyio.run(go)
    assert (finished["limit"], finished["reason"]) == ("max_turns", "max_turns 1 reached")
