"""A deliberately broken tool path for proving the crash matrix works: the tool's effect runs
*before* its ``tool_started`` intent is written. Never used outside ``crash-test --broken``
and the test that checks the matrix catches it.

It is installed through the harness's documented hook for the tool path
(``Harness(..., tool_calls=BrokenToolCalls)``, see
:class:`~durable_harness.harness.tool_calls.ToolCalls`), never by patching the library.
"""

from __future__ import annotations

from durable_harness import crash
from durable_harness.harness.core import _LiveRun
from durable_harness.harness.records import record
from durable_harness.harness.state import ToolCallState
from durable_harness.harness.tool_calls import ToolCalls
from durable_harness.ids import new_id
from durable_harness.storage.base import RecordOp


class BrokenToolCalls(ToolCalls):
    """:class:`ToolCalls` with the effect before the intent (see the module docstring)."""

    async def run_tool(self, live: _LiveRun, call: ToolCallState) -> None:
        """Run the tool, *then* write its intent (wrong on purpose), then settle it."""
        s = live.state
        tool = self.core.tools[call.tool_name]
        args = tool.parse_args(call.arguments)
        ctx = self.tool_ctx(s, call)
        result = await tool.execute(args, ctx)  # BROKEN: the effect starts before its intent
        crash.crash_point("after_tool_effect")
        result_id = new_id()
        self.core.commit(
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
        self.settle(live, call, result, outcome="ok", result_id=result_id)
        crash.crash_point("after_tool_finished")
