"""A deliberately broken tool path for proving the crash matrix works: the tool's effect runs
*before* its ``tool_started`` intent is written. Never used outside ``crash-test --broken``
and the test that checks the matrix catches it."""

from __future__ import annotations

from typing import Any

from durable_harness import crash
from durable_harness.harness import harness as harness_mod
from durable_harness.harness.records import record
from durable_harness.ids import new_id
from durable_harness.storage.base import RecordOp


async def _broken_run_tool(self: Any, live: Any, call: Any) -> None:
    s = live.state
    tool = self.tools[call.tool_name]
    args = tool.parse_args(call.arguments)
    ctx = self._tool_ctx(s, call)
    result = await tool.execute(args, ctx)  # BROKEN: the effect starts before its intent
    crash.crash_point("after_tool_effect")
    result_id = new_id()
    self._commit(
        [
            RecordOp(
                record(
                    "tool_started",
                    s.lane,
                    s.run_id,
                    toolCallId=call.tool_call_id,
                    toolName=call.tool_name,
                    arguments=call.arguments,
                    resultEntryId=result_id,
                    replay=tool.replay,
                    idempotencyKey=ctx.idempotency_key,
                    attempt=call.attempts + 1,
                )
            )
        ],
        live,
    )
    crash.crash_point("after_tool_started")
    self._settle(live, call, result, outcome="ok", result_id=result_id)
    crash.crash_point("after_tool_finished")


def install() -> None:
    """Swap the broken order into :class:`~durable_harness.harness.harness.Harness`."""
    harness_mod.Harness._run_tool = _broken_run_tool  # type: ignore[method-assign]
