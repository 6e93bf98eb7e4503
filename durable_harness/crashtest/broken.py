"""A deliberately broken tool path for proving the crash matrix works: the tool's effect runs
*before* its ``tool_started`` intent is written. Never used outside ``crash-test --broken``
and the test that checks the matrix catches it.

It is installed through the harness's documented hook for the tool path
(``Harness(..., tool_calls=BrokenToolCalls)``, see
:class:`~durable_harness.harness.tool_calls.ToolCalls`), never by patching the library.
"""

from __future__ import annotations

from durable_harness import crash
from durable_harness.harness.core import LiveRun
from durable_harness.harness.state import ToolCallState
from durable_harness.harness.tool_calls import ToolCalls


class BrokenToolCalls(ToolCalls):
    """:class:`ToolCalls` with the effect before the intent (see the module docstring)."""

    async def run_tool(self, live: LiveRun, call: ToolCallState) -> None:
        """Run the tool, *then* write its intent (wrong on purpose), then settle it."""
        tool = self.core.tools[call.tool_name]
        args = tool.parse_args(call.arguments)
        ctx = self.tool_ctx(live.state, call)
        result = await tool.execute(args, ctx)  # BROKEN: the effect starts before its intent
        crash.crash_point("after_tool_effect")
        result_id = self.intent(live, call, tool, ctx)
        crash.crash_point("after_tool_started")
        self.settle(live, call, result, outcome="ok", result_id=result_id)
        crash.crash_point("after_tool_finished")
