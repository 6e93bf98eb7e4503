"""Tool calls of a turn: write-ahead intents, execution, settlement, in-doubt calls and
the settlement of an aborted run (``design/run-loop.md``, ``design/recovery.md``)."""

from __future__ import annotations

from typing import Any, Literal

import anyio

from durable_harness import crash
from durable_harness.errors import ToolError
from durable_harness.harness.core import HarnessCore, LiveRun, Suspend
from durable_harness.harness.groups import kill_groups, killed_record
from durable_harness.harness.records import call_record, idempotency_key, record
from durable_harness.harness.state import (
    RunState,
    ToolCallState,
)
from durable_harness.harness.steps import RUNS_TOOL, Step
from durable_harness.ids import new_id, now_ms
from durable_harness.storage.base import EntryOp, Op, RecordOp
from durable_harness.tools.base import Tool, ToolContext, ToolResult
from durable_harness.tools.processes import process_start_time, this_host

ABORTED_TOOL_TEXT = (
    "Tool call aborted: the run was aborted while it ran; its effect may be partial."
)
NOT_RUN_TEXT = "Tool call not run: the run was aborted first."
FAILED_BY_DECISION = (
    "Tool call interrupted by a crash; its outcome is unknown and it was not retried "
    "(decision: fail)."
)


def _checked_result(tool_name: str, result: Any) -> ToolResult:
    """``result`` if it is a :class:`ToolResult` whose ``is_error`` is a bool (what the
    ``tool_finished`` record holds, not re-checked at commit), else an error result naming the
    tool bug."""
    if isinstance(result, ToolResult) and type(result.is_error) is bool:
        return result
    what = (
        f"is_error of type {type(result.is_error).__name__}"
        if isinstance(result, ToolResult)
        else type(result).__name__
    )
    return ToolResult.text(
        f"tool {tool_name} returned {what}, not a ToolResult with a bool is_error", is_error=True
    )


class ToolCalls:
    """The harness's tool-call component over its ``core``: runs a turn's tool calls (intent
    durable before the effect), settles them, and settles aborted runs. Also the harness's one
    extension point for the tool path (``Harness(..., tool_calls=SubClass)``): the crash
    matrix's self-test installs a deliberately broken order with it
    (:mod:`durable_harness.crashtest.broken`); production code has no reason to."""

    def __init__(self, core: HarnessCore) -> None:
        self.core = core
        # groups this harness started (``on_process``): not leftovers of a dead harness
        self._own_groups: set[int] = set()

    # -- tool calls ------------------------------------------------------------------------

    async def tool_batch(self, live: LiveRun, step: Step) -> None:
        """Execute a step's call actions (``design/recovery.md``): the calls to run run (in
        parallel), the others are settled as decided; then, if any call waits for a
        decision, the run suspends."""
        s = live.state
        to_run: list[ToolCallState] = []
        live.waiting = []
        for call in [c for c in s.tool_calls if c.status != "completed"]:
            action = step.calls.get(call.key, "execute")
            if call.status == "in_doubt":  # before it re-runs, waits or is settled
                self.stop_leftover(live, call)
            if action in RUNS_TOOL:
                to_run.append(call)
            elif action == "await_decision":
                live.waiting.append(call.tool_call_id)
            elif action == "reconcile":
                self.settle(live, call, live.results[call.key], outcome="reconciled")
            elif action == "fail":
                result = ToolResult.text(FAILED_BY_DECISION, is_error=True)
                self.settle(live, call, result, outcome="failed_by_policy")
            elif action == "apply_decision":
                self._apply_decision(live, call)
            elif action == "reject":
                self._reject_unknown(live, call)
        if len(to_run) == 1:  # the common batch: no task group needed to run it
            await self.run_tool(live, to_run[0])
        elif to_run:
            async with anyio.create_task_group() as tg:
                for call in to_run:
                    tg.start_soon(self.run_tool, live, call)
        if live.waiting:  # everything that could run has run; the rest waits for decisions
            self.core.emit("suspended", live, reason="awaiting_decision", awaiting=live.waiting)
            raise Suspend()

    def stop_leftover(self, live: LiveRun, call: ToolCallState) -> None:
        """Kill the process group recorded for ``call`` if it is still alive, and wait until
        it is gone, before the call is settled or re-run (:func:`~durable_harness.harness.
        groups.kill_groups`, the one rule shared with the host). A group this harness started
        itself is stopped by its tool on the way out, so for it this only waits, and records
        nothing: ``tool_process_killed`` means a dead harness's leftover was found.

        Raises:
            ToolProcessRunning: the group outlived SIGKILL by ``KILL_WAIT`` seconds (nothing
                is settled).
        """
        if call.process is None:
            return  # no group recorded (every call but a running bash's): nothing to kill
        for killed in kill_groups([call], self.core.session.id):
            pgid = (killed.process or {}).get("pgid")
            if pgid in self._own_groups:
                continue  # started here: its tool's own cleanup was finishing (an abort)
            s = live.state
            self.core.commit([RecordOp(killed_record(s.lane, s.run_id, killed, "resume"))], live)
            self.core.emit("tool_process_killed", live, toolCallId=killed.tool_call_id, pgid=pgid)
        call.process = None

    def _apply_decision(self, live: LiveRun, call: ToolCallState) -> None:
        """Settle a call by its recorded ``fail`` or ``result`` decision."""
        decision = call.decision or {}
        kind = decision.get("decision")
        text = str(decision.get("result")) if kind == "result" else FAILED_BY_DECISION
        result = ToolResult.text(text, is_error=kind != "result")
        self.settle(live, call, result, outcome=f"decided_{kind}")

    def settle_not_run(self, live: LiveRun, reason: str) -> None:
        """Give every unstarted call of the turn a "not run" result (a run that fails at its
        limit keeps a well-formed transcript)."""
        for call in live.state.tool_calls:
            if call.status == "not_started":
                text = f"Tool call not run: {reason}."
                self.settle(live, call, ToolResult.text(text, is_error=True), outcome="not_run")

    def tool_ctx(
        self, s: RunState, call: ToolCallState, live: LiveRun | None = None
    ) -> ToolContext:
        key = idempotency_key(s.run_id, call.key)

        def on_process(pgid: int) -> None:
            # Written without its own fsync: a process crash keeps it (page cache); it only
            # serves to find a process group the crashed harness left behind.
            if type(pgid) is not int or pgid <= 0:
                raise ToolError(f"on_process needs a positive process group id, not {pgid!r}")
            self._own_groups.add(pgid)
            rec = call_record(
                "tool_process",
                s.lane,
                s.run_id,
                call,
                pgid=pgid,
                startTime=process_start_time(pgid),
                host=this_host(),
            )
            self.core.commit([RecordOp(rec)], live)

        return ToolContext(
            cwd=self.core.cwd,
            run_id=s.run_id,
            tool_call_id=call.tool_call_id,
            idempotency_key=key,
            on_process=on_process if live is not None else None,
            stop_grace=lambda: self.core.stop_grace,
        )

    def _reject_unknown(self, live: LiveRun, call: ToolCallState) -> None:
        """Answer a call of a tool that is not registered with an error result (no intent:
        nothing runs)."""
        result = ToolResult.text(f"unknown tool {call.tool_name!r}", is_error=True)
        self.settle(live, call, result, outcome="error")

    async def run_tool(self, live: LiveRun, call: ToolCallState) -> None:
        s = live.state
        tool = self.core.tools.get(call.tool_name)
        if tool is None:
            self._reject_unknown(live, call)
            return
        try:
            args = tool.parse_args(call.arguments)
        except ToolError as exc:
            self.settle(live, call, ToolResult.text(exc.message, is_error=True), outcome="error")
            return
        ctx = self.tool_ctx(s, call, live)
        result_id = self.intent(live, call, tool, ctx)
        await self.core.barrier()
        crash.crash_point("after_tool_started")
        self.core.emit(
            "tool_execution_start",
            live,
            toolCallId=call.tool_call_id,
            toolName=call.tool_name,
            arguments=call.arguments,
        )
        try:
            result = await tool.execute(args, ctx)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # a tool bug becomes an error result, not a dead run
            result = ToolResult.text(
                f"tool {call.tool_name} raised {type(exc).__name__}: {exc}", is_error=True
            )
        else:
            result = _checked_result(call.tool_name, result)
        crash.crash_point("after_tool_effect")
        if self.core.fenced:  # after a close's kill step: not the call's result; in doubt
            return
        outcome = "error" if result.is_error else "ok"
        if self.settle(live, call, result, outcome=outcome, result_id=result_id):
            crash.crash_point("after_tool_finished")

    def intent(self, live: LiveRun, call: ToolCallState, tool: Tool, ctx: ToolContext) -> str:
        """Commit the call's ``tool_started`` intent (not yet durable: the caller's barrier
        makes it so before the effect); returns the result entry id it provisions."""
        s, result_id = live.state, new_id()
        rec = call_record(
            "tool_started",
            s.lane,
            s.run_id,
            call,
            **tool.intent_fields(),
            toolName=call.tool_name,
            arguments=call.arguments,
            resultEntryId=result_id,
            replay=tool.replay,
            idempotencyKey=ctx.idempotency_key,
            attempt=call.attempts + 1,
        )
        self.core.commit([RecordOp(rec)], live)
        return result_id

    def settle(
        self,
        live: LiveRun,
        call: ToolCallState,
        result: ToolResult,
        *,
        outcome: str,
        result_id: str | None = None,
    ) -> bool:
        """Commit a tool call's result entry and its ``tool_finished`` record together
        (nothing once fenced). The turn's last settlement is held for the commit of what
        follows it, the save point and the next intent (``design/run-loop.md`` "Merged
        commits"). Returns True when the settlement is written now, False when held."""
        if self.core.fenced:
            return False
        last = True  # every other call of the turn is settled already
        for c in live.state.tool_calls:
            if c is not call and c.status != "completed":
                last = False
                break
        ops = self._settlement_ops(live, call, result, outcome, result_id)
        self.core.commit(ops, live, hold=last)
        self._ended(live, call, result.is_error, outcome)
        return not last

    def _ended(self, live: LiveRun, call: ToolCallState, is_error: bool, outcome: str) -> None:
        self.core.emit(
            "tool_execution_end",
            live,
            toolCallId=call.tool_call_id,
            toolName=call.tool_name,
            isError=is_error,
            outcome=outcome,
        )

    def _settlement_ops(
        self,
        live: LiveRun,
        call: ToolCallState,
        result: ToolResult,
        outcome: str,
        result_id: str | None = None,
        parent: str | Literal[False] | None = False,
    ) -> list[Op]:
        """The result entry (under the lane's leaf, or ``parent``) and its ``tool_finished``
        record, under the id the intent provisioned unless it is taken already (only an id
        read back from the log, of a recovered call, can be). Every settlement comes through
        here, so a group recorded for the call is killed first (:meth:`stop_leftover`)."""
        self.stop_leftover(live, call)
        s = live.state
        rid = result_id or call.result_entry_id or new_id()
        if result_id is None and self.core.store.get_entry(rid) is not None:
            rid = new_id()
        message: dict[str, Any] = {
            "role": "toolResult",
            "toolCallId": call.tool_call_id,
            "toolName": call.tool_name,
            "content": result.content,
            "isError": result.is_error,
            "timestamp": now_ms(),
        }
        if result.details is not None:
            message["details"] = result.details
        entry = self.core.entry(
            s.lane, {"type": "message", "id": rid, "message": message}, parent=parent
        )
        finished = call_record(
            "tool_finished",
            s.lane,
            s.run_id,
            call,
            resultEntryId=rid,
            isError=result.is_error,
            outcome=outcome,
        )
        return [EntryOp(entry, lane=s.lane), RecordOp(finished)]

    # -- abort -----------------------------------------------------------------------------

    def settle_aborted(self, live: LiveRun) -> None:
        """Settle an aborted run in one commit: keep complete parts of a partial answer, give
        every open tool call a result, cancel steer/follow-up items, apply deferred writes.
        Fenced (a close's kill step passed): nothing; the run stays open, its calls in doubt."""
        if self.core.fenced:
            return
        s = live.state
        ops: list[Op] = []
        leaf = self.core.session.leaf(s.lane)
        if s.pending is not None:
            kept = [b for b in live.partial if b.get("type") == "text" and b.get("text")]
            if kept and s.pending.purpose == "turn":  # a partial summary is no answer
                msg = {
                    "role": "assistant",
                    "content": kept,
                    "provider": self.core.provider.name,
                    "model": self.core.model(s.lane),
                    "stopReason": "aborted",
                    "timestamp": now_ms(),
                }
                entry = self.core.entry(
                    s.lane,
                    {"type": "message", "id": s.pending.response_entry_id, "message": msg},
                    parent=leaf,
                )
                ops.append(EntryOp(entry, lane=s.lane))
                leaf = entry["id"]
            ops.append(
                RecordOp(
                    record(
                        "provider_request_failed",
                        s.lane,
                        s.run_id,
                        turn=s.pending.turn,
                        attempt=s.pending.attempt,
                        error="aborted",
                        retryable=False,
                        purpose=s.pending.purpose,
                        costUnknown=True,
                    )
                )
            )
        for call in s.tool_calls:
            if call.status == "completed":
                continue
            text = ABORTED_TOOL_TEXT if call.status == "in_doubt" else NOT_RUN_TEXT
            settled = self._settlement_ops(
                live, call, ToolResult.text(text, is_error=True), "aborted", parent=leaf
            )
            ops += settled
            leaf = settled[0].entry["id"]  # type: ignore[union-attr]
        lane_log = self.core.lane_log(s.lane)
        cancelled = lane_log.pending("steer") + lane_log.pending("follow_up")
        if cancelled:
            ops.append(
                RecordOp(
                    record(
                        "queue_cancelled", s.lane, s.run_id, itemIds=[q.item_id for q in cancelled]
                    )
                )
            )
            live.returned = [
                {"queue": q.queue, "itemId": q.item_id, "message": q.message} for q in cancelled
            ]
        ops += self.core.finish_ops(live, "aborted", leaf)
        open_calls = [c for c in s.tool_calls if c.status != "completed"]
        self.core.commit(ops, live)
        for call in open_calls:
            self._ended(live, call, True, "aborted")
