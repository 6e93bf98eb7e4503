"""The run driver: starts a run, takes its steps until it settles or suspends, and settles it
(``design/run-loop.md``).

The same driver runs a fresh run and a recovered one: it looks at the run's folded state
(:class:`~durable_harness.harness.state.RunState`) and takes the next step
(:func:`~durable_harness.harness.steps.next_step`), or first the step recovery planned, so a
resumed run continues exactly where the crashed one stopped.
"""

from __future__ import annotations

from typing import Any

import anyio

from durable_harness import crash
from durable_harness.errors import AttemptCapReached, FormatError, ProviderError, RecoveryError
from durable_harness.harness.core import HarnessCore, LiveRun, RunHandle, Suspend
from durable_harness.harness.records import record
from durable_harness.harness.state import QueueItem, RunState
from durable_harness.harness.steps import Step, next_step
from durable_harness.harness.tool_calls import ToolCalls
from durable_harness.harness.turns import Turns
from durable_harness.ids import uuid7
from durable_harness.storage.base import EntryOp, Op, RecordOp


class Driver:
    """Drives the runs of one harness over its :class:`~durable_harness.harness.core.
    HarnessCore`, with its provider component (:class:`~durable_harness.harness.turns.Turns`)
    and its tool-call component (:class:`~durable_harness.harness.tool_calls.ToolCalls`)."""

    def __init__(self, core: HarnessCore, turns: Turns, tool_calls: ToolCalls) -> None:
        self.core = core
        self.turns = turns
        self.tool_calls = tool_calls

    def start_run(
        self,
        lane: str,
        message: dict[str, Any],
        consumed: QueueItem | None,
        client_key: str | None = None,
    ) -> RunHandle:
        """Commit ``run_started`` with the prompt's entry (and the ``queue_consumed`` of the
        next-run item it came from) and launch the run; durable at the caller's barrier."""
        core = self.core
        run_id = uuid7()
        entry = core.entry(lane, {"type": "message", "message": message})
        rec = record(
            "run_started",
            lane,
            run_id,
            promptEntryId=entry["id"],
            prompt=message,
            provider=core.provider.name,
            model=core.provider.model,
            providerSpec=core.options.provider_spec,
            limits=core.options.limits.to_record(),
        )
        keep_client_key(rec, client_key)
        ops: list[Op] = [EntryOp(entry, lane=lane), RecordOp(rec)]
        if consumed is not None:
            ops.append(
                RecordOp(
                    record(
                        "queue_consumed",
                        lane,
                        run_id,
                        queue="next_run",
                        itemIds=[consumed.item_id],
                        entryIds=[entry["id"]],
                    )
                )
            )
        live = LiveRun(RunState(run_id, lane, limits=core.options.limits))
        core.commit(ops, live)
        crash.crash_point("after_run_started")
        return self.launch(live)

    def launch(self, live: LiveRun) -> RunHandle:
        """Drive ``live`` in the harness's task group; returns its handle.

        Raises:
            RuntimeError: the harness is not entered (``async with``).
        """
        if self.core.tg is None:
            raise RuntimeError("use the Harness as `async with Harness(...) as h:`")
        self.core.runs[live.state.lane] = live
        self.core.tg.start_soon(self._drive, live)
        return RunHandle(live)

    def start_next(self, lane: str) -> None:
        """Start the lane's oldest next-run item, if the lane is idle and one waits."""
        if lane in self.core.runs or self.core.tg is None:
            return
        pending = self.core.lane_log(lane).pending("next_run")
        if pending:
            self.start_run(lane, pending[0].message, consumed=pending[0])

    async def _drive(self, live: LiveRun) -> None:
        core, s = self.core, live.state
        core.emit("run_start", live)
        try:
            with anyio.CancelScope() as scope:
                live.scope = scope
                if not s.abort_requested:
                    await self._steps(live)
            if s.abort_requested and s.outcome is None:
                with anyio.CancelScope(shield=True):
                    self.tool_calls.settle_aborted(live)
        except Suspend:
            live.outcome = None
        except AttemptCapReached as exc:
            self._finish(live, "failed", reason=exc.message, limit="attempt_cap")
        except ProviderError as exc:
            self._finish(live, "failed", reason=exc.message)
        finally:
            with anyio.CancelScope(shield=True):
                await core.barrier()
            live.outcome = s.outcome if s.outcome else live.outcome
            core.runs.pop(s.lane, None)
            core.emit(
                "run_end", live, outcome=live.outcome or "suspended", awaiting=list(live.waiting)
            )
            live.done.set()
        if s.outcome is not None:
            self.start_next(s.lane)

    async def _steps(self, live: LiveRun) -> None:
        """Take steps until the run settles or suspends: first the recovery step (when
        resuming), then whatever :func:`~durable_harness.harness.steps.next_step` says."""
        s = live.state
        while s.outcome is None and not s.abort_requested:
            step, live.first = live.first, None
            if step is None:
                step = next_step(s, self.core.lane_log(s.lane), {})
            await self._take(live, step)

    async def _take(self, live: LiveRun, step: Step) -> None:
        """Execute one step (the actions of :data:`~durable_harness.harness.steps.LaneAction`)."""
        s = live.state
        action = step.action
        if action in ("resume_tool_calls", "await_decision"):
            await self.tool_calls.tool_batch(live, step)
        elif action in ("save_point", "deliver_queued"):
            lane_log = self.core.lane_log(s.lane)
            queued = lane_log.pending("steer")
            if not s.tool_calls:
                queued += lane_log.pending("follow_up")
            # joined to a held settlement, the save point is written with the next intent:
            # neither point is a state the store can then be in ("Merged commits")
            held = self.core.holding
            if not held:
                crash.crash_point("before_save_point")
            self._save_point(live, queued, hold=held)
            if not held:
                crash.crash_point("after_save_point")
            self.core.emit("turn_end", live, turn=s.turns)
        elif action == "finish_run":
            self.core.emit("turn_end", live, turn=s.turns)
            if not self.core.holding:
                crash.crash_point("before_run_finished")
            self._finish(live, "failed" if s.last_stop_reason == "error" else "completed")
        elif action == "fail_run_limit":
            self.tool_calls.settle_not_run(live, step.reason or "the run reached its limit")
            self._finish(live, "failed", reason=step.reason, limit=step.limit)
        elif action == "park_failed_attempt_cap":
            self._finish(live, "failed", reason=step.reason, limit=step.limit)
        elif action in ("issue_provider_request", "reissue_provider_request"):
            if step.purpose == "compaction":
                await self.turns.compact(s.lane, live)
            else:
                await self.turns.maybe_compact(live)
                await self.turns.provider_turn(live)
        elif action == "settle_aborted":
            return  # the driver settles an aborted run once the loop ends
        else:
            raise RecoveryError(
                f"run {s.run_id} of session {self.core.session.id}: step {action!r} cannot be "
                "taken inside a run",
                lane=s.lane,
            )

    def _finish(self, live: LiveRun, outcome: str, **extra: Any) -> None:
        leaf = self.core.session.leaf(live.state.lane)
        self.core.commit(self.core.finish_ops(live, outcome, leaf, **extra), live)
        crash.crash_point("after_run_finished")

    def _save_point(self, live: LiveRun, queued: list[QueueItem], *, hold: bool) -> None:
        """Deliver queued messages and apply deferred writes between turns, in one commit
        (``hold``: held for the next, :meth:`HarnessCore.commit`)."""
        core, s = self.core, live.state
        leaf = core.session.leaf(s.lane)
        ops, applied = core.deferred_ops(s.lane, leaf)
        if ops:
            leaf = ops[-1].entry["id"]  # type: ignore[union-attr]
        by_queue: dict[str, list[str]] = {}
        entry_ids: list[str] = []
        for item in queued:
            entry = core.entry(s.lane, {"type": "message", "message": item.message}, parent=leaf)
            ops.append(EntryOp(entry, lane=s.lane))
            leaf = entry["id"]
            entry_ids.append(entry["id"])
            by_queue.setdefault(item.queue, []).append(item.item_id)
        for queue, ids in by_queue.items():
            ops.append(
                RecordOp(record("queue_consumed", s.lane, s.run_id, queue=queue, itemIds=ids))
            )
        save = record(
            "save_point",
            s.lane,
            s.run_id,
            turn=s.turns,
            appliedWrites=applied,
            deliveredEntries=entry_ids,
        )
        core.commit([*ops, RecordOp(save)], live, hold=hold)


def keep_client_key(rec: dict[str, Any], client_key: str | None) -> None:
    """Put the caller's ``client_key`` on ``rec`` (if given).

    Raises:
        FormatError: ``client_key`` is not a string (nothing is written).
    """
    if client_key is None:
        return
    if not isinstance(client_key, str):
        raise FormatError(f"client_key must be a string, not {type(client_key).__name__}")
    rec["clientKey"] = client_key
