"""The durable run loop.

A :class:`Harness` drives the runs of one session, one open run per lane, writing the lane
operation log as it goes (``design/run-loop.md`` gives the state machine and the write order).
Every public ``async`` verb that accepts input (``prompt``, ``steer``, ``follow_up``,
``next_run``, the setters, ``abort``) returns only after its record is durable.

The same driver runs a fresh run and a recovered one: it looks at the run's folded state
(:class:`~durable_harness.harness.state.RunState`) and takes the next step, so a resumed run
continues exactly where the crashed one stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import tenacity

from durable_harness import crash
from durable_harness.errors import (
    AttemptCapReached,
    LaneSuspended,
    NoOpenRun,
    ProviderError,
    RunInProgress,
    ToolError,
)
from durable_harness.harness.records import idempotency_key, record
from durable_harness.harness.state import (
    LaneLog,
    QueueItem,
    RunState,
    ToolCallState,
    fold_lane,
    fold_run,
)
from durable_harness.ids import new_id, now_iso, now_ms, uuid7
from durable_harness.models.entries import validate_message
from durable_harness.models.messages import text_of
from durable_harness.providers.base import (
    Done,
    Provider,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
)
from durable_harness.session.context import estimate_tokens
from durable_harness.session.session import Session
from durable_harness.storage.base import EntryOp, Op, RecordOp
from durable_harness.tools.base import Tool, ToolContext, ToolResult

Policy = Literal["ask", "fail-in-doubt", "retry-safe"]
POLICIES: tuple[Policy, ...] = ("ask", "fail-in-doubt", "retry-safe")
Event = dict[str, Any]

ABORTED_TOOL_TEXT = (
    "Tool call aborted: the run was aborted while it ran; its effect may be partial."
)
NOT_RUN_TEXT = "Tool call not run: the run was aborted first."
FAILED_BY_DECISION = (
    "Tool call interrupted by a crash; its outcome is unknown and it was not retried "
    "(decision: fail)."
)


@dataclass
class HarnessOptions:
    """Run-loop settings.

    Attributes:
        system_prompt: system text sent with every request.
        attempt_cap: provider attempts per turn, counted durably across restarts.
        retry_initial, retry_max: exponential backoff between attempts, in seconds.
        max_turns: turns per run before the run fails (a runaway guard).
        policy: what to do with in-doubt tool calls (see ``design/recovery.md``).
        compact_reserve: tokens kept free in the context window; auto-compaction triggers at
            a checkpoint when the estimated context exceeds ``context_window - compact_reserve``.
        keep_recent_tokens: tokens of recent context a compaction keeps verbatim.
    """

    system_prompt: str | None = None
    attempt_cap: int = 5
    retry_initial: float = 0.2
    retry_max: float = 5.0
    max_turns: int = 50
    policy: Policy = "ask"
    compact_reserve: int = 16_384
    keep_recent_tokens: int = 20_000
    provider_spec: str | None = None


@dataclass
class _LiveRun:
    state: RunState
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None
    partial: list[dict[str, Any]] = field(default_factory=list)
    returned: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    waiting: list[str] = field(default_factory=list)
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)


class RunHandle:
    """A run accepted by :meth:`Harness.prompt` (or resumed).

    Attributes:
        run_id, lane: identity.
    """

    def __init__(self, live: _LiveRun) -> None:
        self._live = live
        self.run_id = live.state.run_id
        self.lane = live.state.lane

    async def wait(self) -> str:
        """Wait until the run settles or suspends; return ``completed``, ``aborted``,
        ``failed``, ``declined`` or ``suspended`` (awaiting a decision)."""
        await self._live.done.wait()
        return self._live.outcome or "suspended"

    @property
    def awaiting(self) -> list[str]:
        """Tool call ids the run waits on a decision for (when suspended)."""
        return list(self._live.waiting)


class _Suspend(Exception):
    pass


class Harness:
    """Drives the runs of one :class:`Session` (use as ``async with Harness(...) as h``).

    Args:
        session: an open, writable session.
        provider: the model provider.
        tools: the tools offered to the model (a list or ``{name: tool}``).
        cwd: working directory for tools (default: the session's ``cwd``).
        options: :class:`HarnessOptions`.
    """

    def __init__(
        self,
        session: Session,
        provider: Provider,
        tools: list[Tool] | dict[str, Tool] | None = None,
        *,
        cwd: str | Path | None = None,
        options: HarnessOptions | None = None,
    ) -> None:
        self.session = session
        self.store = session.store
        self.provider = provider
        tool_list = list(tools.values()) if isinstance(tools, dict) else list(tools or [])
        self.tools: dict[str, Tool] = {t.name: t for t in tool_list}
        self._specs = [t.spec() for t in tool_list]
        self.cwd = Path(cwd or session.cwd or ".")
        self.options = options or HarnessOptions()
        self._runs: dict[str, _LiveRun] = {}
        self._lanes: dict[str, LaneLog] = {}
        self._subscribers: list[Callable[[Event], Any]] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._lane_locks: dict[str, anyio.Lock] = {}

    async def __aenter__(self) -> Harness:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        assert self._tg is not None
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # An error raised in the body of `async with Harness(...)` (e.g. LaneSuspended from
            # prompt()) comes back wrapped by the task group: hand the caller the error itself.
            if exc is not None and len(group.exceptions) == 1 and group.exceptions[0] is exc:
                raise exc from None
            raise
        finally:
            self._tg = None

    # -- events ----------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[Event], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns an unsubscribe function.

        Events: ``run_start``, ``turn_start``, ``message_start``, ``message_update``,
        ``message_end``, ``tool_execution_start``, ``tool_execution_end``, ``turn_end``,
        ``run_end``, ``queue_update``. Each is a dict with ``type``, ``lane`` and ``runId``.
        """
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def _emit(self, etype: str, live: _LiveRun | None, **fields: Any) -> None:
        event = {"type": etype, **fields}
        if live is not None:
            event.setdefault("lane", live.state.lane)
            event.setdefault("runId", live.state.run_id)
        for cb in list(self._subscribers):
            cb(event)

    # -- commits ---------------------------------------------------------------------------
    def _lane_log(self, lane: str) -> LaneLog:
        if lane not in self._lanes:
            self._lanes[lane] = fold_lane(self.store.records(lane))
        return self._lanes[lane]

    def _commit(
        self, ops: list[Op], live: _LiveRun | None = None, assistant: dict[str, Any] | None = None
    ) -> None:
        """Commit ``ops``, then fold its records into the run and lane state.

        In ``sync`` mode the commit is durable when this returns. In ``batch`` mode it is
        written but its fsync is shared: :meth:`_barrier` waits for it, and the harness calls
        it before every effect (a provider request, a tool) and before a verb that accepted
        input returns, so write-ahead holds with one fsync per boundary instead of per commit.
        """
        self.store.commit(ops, wait=self.store.durability != "batch")
        for op in ops:
            if isinstance(op, RecordOp):
                rec = op.record
                lane = rec.get("lane")
                if lane is not None:
                    self._lane_log(str(lane)).apply(rec)
                if live is not None and rec.get("runId") == live.state.run_id:
                    live.state.apply(rec, assistant)

    async def _barrier(self) -> None:
        """Wait until every commit so far is durable (``batch`` mode; otherwise a no-op)."""
        await self.store.wait_durable_async()

    def _entry(
        self, lane: str, entry: dict[str, Any], *, parent: str | Literal[False] | None = False
    ) -> dict[str, Any]:
        """Prepare an entry appended under the lane's leaf (or ``parent``)."""
        leaf = self.session.leaf(lane) if parent is False else parent
        return self.session.make_entry(entry, parent_id=leaf, validate=False)

    # -- accepting input -------------------------------------------------------------------
    def _check_idle(self, lane: str) -> None:
        if lane in self._runs:
            raise RunInProgress(
                f"lane {lane!r} of session {self.session.id} already has run "
                f"{self._runs[lane].state.run_id}",
                lane=lane,
            )
        open_run = self.session.lane(lane).run_id
        if open_run is not None:
            raise LaneSuspended(
                f"lane {lane!r} of session {self.session.id} has interrupted run "
                f"{open_run}; run `durable-harness recover` and `resume`",
                lane=lane,
                run_id=open_run,
            )

    def accepted(self, client_key: str, lane: str = "main") -> dict[str, Any] | None:
        """Return the record that accepted input sent with ``client_key`` on ``lane`` (a
        ``run_started``, ``queue_enqueued`` or ``write_deferred``), or ``None``: lets a client
        that lost its acknowledgement in a crash retry without sending the input twice."""
        for rec in self.store.records(
            lane, types=("run_started", "queue_enqueued", "write_deferred")
        ):
            if rec.get("clientKey") == client_key:
                return rec
        return None

    async def prompt(
        self, text: str | dict[str, Any], *, lane: str = "main", client_key: str | None = None
    ) -> RunHandle:
        """Accept a prompt and start a run on ``lane``; returns once ``run_started`` (with the
        user entry, in the same commit) is durable. ``client_key`` is kept on the record (see
        :meth:`accepted`).

        Raises:
            RunInProgress: the lane has a live run.
            LaneSuspended: the lane has an interrupted run waiting for recovery.
        """
        self._check_idle(lane)
        message = _user_message(text)
        handle = self._start_run(lane, message, consumed=None, client_key=client_key)
        await self._barrier()
        return handle

    def _start_run(
        self,
        lane: str,
        message: dict[str, Any],
        consumed: QueueItem | None,
        client_key: str | None = None,
    ) -> RunHandle:
        run_id = uuid7()
        entry = self._entry(lane, {"type": "message", "message": message})
        rec = record(
            "run_started",
            lane,
            run_id,
            promptEntryId=entry["id"],
            prompt=message,
            provider=self.provider.name,
            model=self.provider.model,
            providerSpec=self.options.provider_spec,
        )
        if client_key is not None:
            rec["clientKey"] = client_key
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
        live = _LiveRun(RunState(run_id, lane))
        self._commit(ops, live)
        crash.crash_point("after_run_started")
        return self._launch(live)

    def _launch(self, live: _LiveRun) -> RunHandle:
        if self._tg is None:
            raise RuntimeError("use the Harness as `async with Harness(...) as h:`")
        self._runs[live.state.lane] = live
        self._tg.start_soon(self._drive, live)
        return RunHandle(live)

    async def _enqueue(
        self, queue: str, text: str | dict[str, Any], lane: str, client_key: str | None = None
    ) -> str:
        message = _user_message(text)
        run = self._runs.get(lane)
        if queue != "next_run" and run is None:
            raise NoOpenRun(
                f"no run is open on lane {lane!r} of session {self.session.id} to "
                f"take a {queue} message; use prompt()",
                lane=lane,
            )
        item_id = new_id()
        rec = record(
            "queue_enqueued",
            lane,
            run.state.run_id if run else None,
            queue=queue,
            itemId=item_id,
            message=message,
        )
        if client_key is not None:
            rec["clientKey"] = client_key
        self._commit([RecordOp(rec)], run)
        await self._barrier()
        crash.crash_point("after_queue_enqueued")
        self._emit("queue_update", run, lane=lane, queue=queue, itemId=item_id)
        if queue == "next_run" and run is None and self.session.lane(lane).run_id is None:
            self._start_next(lane)
        return item_id

    async def steer(
        self, text: str | dict[str, Any], *, lane: str = "main", client_key: str | None = None
    ) -> str:
        """Queue a steering message for the next checkpoint of the lane's run; returns its item
        id once the receipt is durable.

        Raises:
            NoOpenRun: no run is open on the lane.
        """
        return await self._enqueue("steer", text, lane, client_key)

    async def follow_up(
        self, text: str | dict[str, Any], *, lane: str = "main", client_key: str | None = None
    ) -> str:
        """Queue a follow-up, delivered when the run would otherwise stop.

        Raises:
            NoOpenRun: no run is open on the lane.
        """
        return await self._enqueue("follow_up", text, lane, client_key)

    async def next_run(
        self, text: str | dict[str, Any], *, lane: str = "main", client_key: str | None = None
    ) -> str:
        """Queue a prompt that starts the lane's next run (at once when the lane is idle)."""
        return await self._enqueue("next_run", text, lane, client_key)

    async def _set(self, lane: str, write: dict[str, Any], client_key: str | None = None) -> None:
        run = self._runs.get(lane)
        if run is None:
            self._commit([EntryOp(self._entry(lane, write), lane=lane)])
        else:
            rec = record("write_deferred", lane, run.state.run_id, write=write)
            if client_key is not None:
                rec["clientKey"] = client_key
            self._commit([RecordOp(rec)], run)
        await self._barrier()

    async def set_model(
        self, provider: str, model_id: str, *, lane: str = "main", client_key: str | None = None
    ) -> None:
        """Change the model: at once when idle, else deferred to the next save point (durable
        when this returns)."""
        await self._set(
            lane, {"type": "model_change", "provider": provider, "modelId": model_id}, client_key
        )

    async def set_thinking_level(self, level: str, *, lane: str = "main") -> None:
        """Change the thinking level (deferred during a run, like :meth:`set_model`)."""
        await self._set(lane, {"type": "thinking_level_change", "thinkingLevel": level})

    async def set_name(self, name: str, *, lane: str = "main") -> None:
        """Name the session (deferred during a run)."""
        await self._set(lane, {"type": "session_info", "name": name})

    async def set_label(self, target_id: str, label: str | None, *, lane: str = "main") -> None:
        """Label an entry (deferred during a run)."""
        self.session.entry(target_id)
        await self._set(lane, {"type": "label", "targetId": target_id, "label": label})

    async def abort(self, *, lane: str = "main") -> list[dict[str, Any]]:
        """Abort the lane's run: ``abort_requested`` is durable before the signal; the provider
        stream and running tools are cancelled; the run settles ``aborted``. Returns the steer and
        follow-up messages that were cancelled (next-run items and deferred writes survive).

        Raises:
            NoOpenRun: no live run on the lane.
        """
        live = self._runs.get(lane)
        if live is None:
            raise NoOpenRun(f"no live run on lane {lane!r} of session {self.session.id}")
        if not live.state.abort_requested:
            self._commit([RecordOp(record("abort_requested", lane, live.state.run_id))], live)
            await self._barrier()
            crash.crash_point("after_abort_requested")
        if live.scope is not None:
            live.scope.cancel()
        await live.done.wait()
        return live.returned

    # -- resuming --------------------------------------------------------------------------
    def load_run(self, lane: str = "main") -> RunState | None:
        """Fold the lane's open run from storage (``None`` when the lane has none)."""
        state = self.session.lane(lane)
        if state.run_id is None or state.run_seq is None:
            return None
        recs = self.store.records(lane, run_id=state.run_id, since_seq=state.run_seq - 1)
        return fold_run(state.run_id, lane, recs, self.store.get_entry)

    async def resume(
        self,
        *,
        lane: str = "main",
        decisions: dict[str, dict[str, Any]] | None = None,
        policy: Policy | None = None,
    ) -> RunHandle | None:
        """Continue the lane's interrupted run from its last safe boundary.

        ``decisions`` maps a tool call id to ``{"decision": "retry" | "fail" | "result",
        "result": text}``; each is written as a durable ``decision`` record before it acts.
        Returns ``None`` when the lane has no open run (a queued next-run item is started).

        Raises:
            RunInProgress: the lane already has a live run in this harness.
        """
        if lane in self._runs:
            raise RunInProgress(f"lane {lane!r} already has a live run", lane=lane)
        state = self.load_run(lane)
        if state is None:
            self._start_next(lane)
            live_next = self._runs.get(lane)
            return RunHandle(live_next) if live_next else None
        live = _LiveRun(state)
        if policy is not None:
            live.decisions["__policy__"] = {"policy": policy}
        for call_id, decision in (decisions or {}).items():
            call = state.call(call_id)
            if call is None or call.status == "completed":
                continue
            rec = record(
                "decision",
                lane,
                state.run_id,
                toolCallId=call_id,
                decision=decision.get("decision"),
                result=decision.get("result"),
            )
            self._commit([RecordOp(rec)], live)
        return self._launch(live)

    # -- the driver ------------------------------------------------------------------------
    async def _drive(self, live: _LiveRun) -> None:
        s = live.state
        self._emit("run_start", live)
        try:
            with anyio.CancelScope() as scope:
                live.scope = scope
                if not s.abort_requested:
                    await self._steps(live)
            if s.abort_requested and s.outcome is None:
                with anyio.CancelScope(shield=True):
                    self._settle_aborted(live)
        except _Suspend:
            live.outcome = None
        except AttemptCapReached as exc:
            self._finish(live, "failed", reason=exc.message)
        except ProviderError as exc:
            self._finish(live, "failed", reason=exc.message)
        finally:
            with anyio.CancelScope(shield=True):
                await self._barrier()
            live.outcome = s.outcome if s.outcome else live.outcome
            self._runs.pop(s.lane, None)
            self._emit(
                "run_end", live, outcome=live.outcome or "suspended", awaiting=list(live.waiting)
            )
            live.done.set()
        if s.outcome is not None:
            self._start_next(s.lane)

    def _start_next(self, lane: str) -> None:
        if lane in self._runs or self._tg is None:
            return
        pending = self._lane_log(lane).pending("next_run")
        if pending:
            self._start_run(lane, pending[0].message, consumed=pending[0])

    async def _steps(self, live: _LiveRun) -> None:
        s = live.state
        while s.outcome is None and not s.abort_requested:
            open_calls = [c for c in s.tool_calls if c.status != "completed"]
            if s.last_assistant_id and open_calls:
                await self._tool_batch(live, open_calls)
            elif s.last_assistant_id and not s.save_point_after:
                lane_log = self._lane_log(s.lane)
                queued = lane_log.pending("steer")
                if not s.tool_calls:
                    queued += lane_log.pending("follow_up")
                if s.tool_calls or queued:
                    crash.crash_point("before_save_point")
                    self._save_point(live, queued)
                    crash.crash_point("after_save_point")
                    self._emit("turn_end", live, turn=s.turns)
                else:
                    self._emit("turn_end", live, turn=s.turns)
                    crash.crash_point("before_run_finished")
                    outcome = "failed" if s.last_stop_reason == "error" else "completed"
                    self._finish(live, outcome)
            elif s.turns >= self.options.max_turns:
                self._finish(live, "failed", reason=f"max_turns {self.options.max_turns} reached")
            else:
                await self._maybe_compact(live)
                await self._provider_turn(live)

    def _finish(self, live: _LiveRun, outcome: str, **extra: Any) -> None:
        s = live.state
        ops, applied = self._deferred_ops(s.lane)
        ops.append(
            RecordOp(
                record(
                    "run_finished",
                    s.lane,
                    s.run_id,
                    outcome=outcome,
                    appliedWrites=applied,
                    **extra,
                )
            )
        )
        self._commit(ops, live)
        crash.crash_point("after_run_finished")

    def _deferred_ops(self, lane: str) -> tuple[list[Op], list[str]]:
        ops: list[Op] = []
        applied: list[str] = []
        leaf = self.session.leaf(lane)
        for rec in self._lane_log(lane).deferred:
            entry = self._entry(lane, dict(rec["write"]), parent=leaf)
            ops.append(EntryOp(entry, lane=lane))
            applied.append(rec["id"])
            leaf = entry["id"]
        return ops, applied

    def _save_point(self, live: _LiveRun, queued: list[QueueItem]) -> None:
        """Deliver queued messages and apply deferred writes between turns, in one commit."""
        s = live.state
        ops, applied = self._deferred_ops(s.lane)
        leaf = ops[-1].entry["id"] if ops else self.session.leaf(s.lane)  # type: ignore[union-attr]
        by_queue: dict[str, list[str]] = {}
        entry_ids: list[str] = []
        for item in queued:
            entry = self._entry(s.lane, {"type": "message", "message": item.message}, parent=leaf)
            ops.append(EntryOp(entry, lane=s.lane))
            leaf = entry["id"]
            entry_ids.append(entry["id"])
            by_queue.setdefault(item.queue, []).append(item.item_id)
        for queue, ids in by_queue.items():
            ops.append(
                RecordOp(record("queue_consumed", s.lane, s.run_id, queue=queue, itemIds=ids))
            )
        ops.append(
            RecordOp(
                record(
                    "save_point",
                    s.lane,
                    s.run_id,
                    turn=s.turns,
                    appliedWrites=applied,
                    deliveredEntries=entry_ids,
                )
            )
        )
        self._commit(ops, live)

    # -- provider turns --------------------------------------------------------------------
    async def _provider_turn(self, live: _LiveRun) -> None:
        s = live.state
        turn = s.turns + 1
        response_id = s.pending.response_entry_id if s.pending else new_id()
        used = s.attempts.get(turn, 0)
        cap = self.options.attempt_cap
        if used >= cap:
            raise AttemptCapReached(
                f"turn {turn} of run {s.run_id} used {used} of {cap} provider attempts",
                attempts=used,
                cap=cap,
            )
        self._emit("turn_start", live, turn=turn)
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(cap - used),
            wait=tenacity.wait_exponential(
                multiplier=self.options.retry_initial, max=self.options.retry_max
            ),
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, ProviderError) and e.retryable
            ),
            sleep=anyio.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._attempt(live, turn, response_id)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            used = s.attempts.get(turn, 0)
            raise AttemptCapReached(
                f"turn {turn} of run {s.run_id} used {used} of {cap} provider attempts "
                f"(attempt cap reached); last error: {exc.message}",
                attempts=used,
                cap=cap,
            ) from exc

    async def _attempt(self, live: _LiveRun, turn: int, response_id: str) -> None:
        s = live.state
        attempt = s.attempts.get(turn, 0) + 1
        ctx = self.session.context(lane=s.lane)
        model = (ctx.model or {}).get("modelId") or self.provider.model
        self._commit(
            [
                RecordOp(
                    record(
                        "provider_request_started",
                        s.lane,
                        s.run_id,
                        turn=turn,
                        attempt=attempt,
                        responseEntryId=response_id,
                        provider=self.provider.name,
                        model=model,
                    )
                )
            ],
            live,
        )
        await self._barrier()
        crash.crash_point("after_provider_request_started")
        request = ProviderRequest(
            messages=ctx.messages,
            tools=self._specs,
            model=model,
            system_prompt=self.options.system_prompt,
            thinking_level=ctx.thinking_level,
            run_id=s.run_id,
            turn=turn,
            attempt=attempt,
            prompt=s.prompt_text,
        )
        try:
            message = await self._stream(live, request)
        except ProviderError as exc:
            with anyio.CancelScope(shield=True):
                self._commit(
                    [
                        RecordOp(
                            record(
                                "provider_request_failed",
                                s.lane,
                                s.run_id,
                                turn=turn,
                                attempt=attempt,
                                error=exc.message,
                                status=exc.status,
                                retryable=exc.retryable,
                            )
                        )
                    ],
                    live,
                )
            raise
        entry = self._entry(s.lane, {"type": "message", "id": response_id, "message": message})
        self._commit(
            [
                EntryOp(entry, lane=s.lane),
                RecordOp(
                    record(
                        "provider_request_finished",
                        s.lane,
                        s.run_id,
                        turn=turn,
                        attempt=attempt,
                        entryId=response_id,
                        usage=message.get("usage"),
                        stopReason=message.get("stopReason"),
                    )
                ),
            ],
            live,
            assistant=message,
        )
        crash.crash_point("after_assistant_entry")

    async def _stream(self, live: _LiveRun, request: ProviderRequest) -> dict[str, Any]:
        live.partial = []
        text: list[str] = []
        first = True
        purpose = request.purpose
        self._emit("message_start", live, role="assistant", purpose=purpose)
        async for event in self.provider.stream(request):
            if first:
                crash.crash_point("mid_provider_stream")
                first = False
            if isinstance(event, TextDelta):
                text.append(event.text)
                live.partial = [{"type": "text", "text": "".join(text)}]
                self._emit("message_update", live, delta=event.text, purpose=purpose)
            elif isinstance(event, ThinkingDelta):
                self._emit("message_update", live, thinking=event.text)
            elif isinstance(event, ToolCallEvent):
                self._emit("message_update", live, toolCall={"id": event.id, "name": event.name})
            elif isinstance(event, Done):
                message = dict(event.message)
                message.setdefault("timestamp", now_ms())
                if _is_empty(message):
                    raise ProviderError(
                        f"provider {self.provider.name} returned an empty message", retryable=True
                    )
                self._emit("message_end", live, message=message, purpose=purpose)
                return message
        raise ProviderError(
            f"provider {self.provider.name} ended its stream without a message", retryable=True
        )

    # -- tool calls ------------------------------------------------------------------------
    def _policy(self, live: _LiveRun) -> Policy:
        chosen = live.decisions.get("__policy__", {}).get("policy")
        for policy in POLICIES:
            if chosen == policy:
                return policy
        return self.options.policy

    async def _tool_batch(self, live: _LiveRun, calls: list[ToolCallState]) -> None:
        s = live.state
        to_run: list[ToolCallState] = []
        live.waiting = []
        for call in calls:
            if call.status == "not_started":
                to_run.append(call)
                continue
            action = await self._in_doubt(live, call)
            if action == "retry":
                to_run.append(call)
            elif action == "wait":
                live.waiting.append(call.tool_call_id)
        if to_run:
            async with anyio.create_task_group() as tg:
                for call in to_run:
                    tg.start_soon(self._run_tool, live, call)
        if live.waiting and all(c.status != "not_started" for c in s.tool_calls):
            self._emit("suspended", live, reason="awaiting_decision", awaiting=live.waiting)
            raise _Suspend()

    async def _in_doubt(self, live: _LiveRun, call: ToolCallState) -> str:
        """Decide what to do with an in-doubt call: ``retry``, ``settled`` or ``wait``."""
        s = live.state
        tool = self.tools.get(call.tool_name)
        if call.decision is not None:
            kind = call.decision.get("decision")
            if kind == "retry":
                return "retry"
            text = str(call.decision.get("result")) if kind == "result" else FAILED_BY_DECISION
            self._settle(
                live,
                call,
                ToolResult.text(text, is_error=kind != "result"),
                outcome=f"decided_{kind}",
            )
            return "settled"
        policy = self._policy(live)
        if policy == "fail-in-doubt":
            self._settle(
                live,
                call,
                ToolResult.text(FAILED_BY_DECISION, is_error=True),
                outcome="failed_by_policy",
            )
            return "settled"
        if tool is not None and call.replay == "safe" and tool.replay == "safe":
            return "retry"
        if tool is not None and tool.can_reconcile:
            try:
                args = tool.parse_args(call.arguments)
                result = await tool.reconcile(args, self._tool_ctx(s, call))
            except ToolError:
                result = None
            if result is not None:
                self._settle(live, call, result, outcome="reconciled")
                return "settled"
        if policy == "retry-safe":
            self._settle(
                live,
                call,
                ToolResult.text(FAILED_BY_DECISION, is_error=True),
                outcome="failed_by_policy",
            )
            return "settled"
        return "wait"

    def _tool_ctx(self, s: RunState, call: ToolCallState) -> ToolContext:
        key = idempotency_key(s.run_id, call.tool_call_id)
        return ToolContext(
            cwd=self.cwd, run_id=s.run_id, tool_call_id=call.tool_call_id, idempotency_key=key
        )

    async def _run_tool(self, live: _LiveRun, call: ToolCallState) -> None:
        s = live.state
        tool = self.tools.get(call.tool_name)
        if tool is None:
            self._settle(
                live,
                call,
                ToolResult.text(f"unknown tool {call.tool_name!r}", is_error=True),
                outcome="error",
            )
            return
        try:
            args = tool.parse_args(call.arguments)
        except ToolError as exc:
            self._settle(live, call, ToolResult.text(exc.message, is_error=True), outcome="error")
            return
        ctx = self._tool_ctx(s, call)
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
        await self._barrier()
        crash.crash_point("after_tool_started")
        self._emit(
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
        crash.crash_point("after_tool_effect")
        self._settle(
            live, call, result, outcome="error" if result.is_error else "ok", result_id=result_id
        )
        crash.crash_point("after_tool_finished")

    def _settle(
        self,
        live: _LiveRun,
        call: ToolCallState,
        result: ToolResult,
        *,
        outcome: str,
        result_id: str | None = None,
    ) -> None:
        """Commit a tool call's result entry and its ``tool_finished`` record together."""
        s = live.state
        rid = result_id or call.result_entry_id or new_id()
        if call.result_entry_id and self.store.get_entry(call.result_entry_id) is None:
            rid = call.result_entry_id if result_id is None else rid
        if self.store.get_entry(rid) is not None:
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
        entry = self._entry(s.lane, {"type": "message", "id": rid, "message": message})
        self._commit(
            [
                EntryOp(entry, lane=s.lane),
                RecordOp(
                    record(
                        "tool_finished",
                        s.lane,
                        s.run_id,
                        toolCallId=call.tool_call_id,
                        resultEntryId=rid,
                        isError=result.is_error,
                        outcome=outcome,
                    )
                ),
            ],
            live,
        )
        self._emit(
            "tool_execution_end",
            live,
            toolCallId=call.tool_call_id,
            toolName=call.tool_name,
            isError=result.is_error,
            outcome=outcome,
        )

    # -- abort -----------------------------------------------------------------------------
    def _settle_aborted(self, live: _LiveRun) -> None:
        """Settle an aborted run in one commit: keep complete parts of a partial answer, give
        every open tool call a result, cancel steer/follow-up items, apply deferred writes."""
        s = live.state
        ops: list[Op] = []
        leaf = self.session.leaf(s.lane)
        if s.pending is not None:
            kept = [b for b in live.partial if b.get("type") == "text" and b.get("text")]
            if kept and s.pending.purpose == "turn":  # a partial summary is no answer
                msg = {
                    "role": "assistant",
                    "content": kept,
                    "provider": self.provider.name,
                    "model": self.provider.model,
                    "stopReason": "aborted",
                    "timestamp": now_ms(),
                }
                entry = self._entry(
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
            rid = call.result_entry_id or new_id()
            if self.store.get_entry(rid) is not None:
                rid = new_id()
            msg = {
                "role": "toolResult",
                "toolCallId": call.tool_call_id,
                "toolName": call.tool_name,
                "content": [{"type": "text", "text": text}],
                "isError": True,
                "timestamp": now_ms(),
            }
            entry = self._entry(s.lane, {"type": "message", "id": rid, "message": msg}, parent=leaf)
            ops.append(EntryOp(entry, lane=s.lane))
            leaf = entry["id"]
            ops.append(
                RecordOp(
                    record(
                        "tool_finished",
                        s.lane,
                        s.run_id,
                        toolCallId=call.tool_call_id,
                        resultEntryId=rid,
                        isError=True,
                        outcome="aborted",
                    )
                )
            )
        lane_log = self._lane_log(s.lane)
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
        applied = []
        for rec in lane_log.deferred:
            entry = self._entry(s.lane, dict(rec["write"]), parent=leaf)
            ops.append(EntryOp(entry, lane=s.lane))
            leaf = entry["id"]
            applied.append(rec["id"])
        ops.append(
            RecordOp(
                record("run_finished", s.lane, s.run_id, outcome="aborted", appliedWrites=applied)
            )
        )
        self._commit(ops, live)

    # -- compaction and navigation ---------------------------------------------------------
    async def _maybe_compact(self, live: _LiveRun) -> None:
        ctx = self.session.context(lane=live.state.lane)
        limit = self.provider.context_window - self.options.compact_reserve
        tokens = ctx.state.tokens if ctx.state else estimate_tokens(ctx.messages)
        if tokens > limit > 0:
            await self.compact(lane=live.state.lane, _live=live)

    async def _summarize(
        self, lane: str, messages: list[dict[str, Any]], purpose: str, live: _LiveRun | None
    ) -> tuple[str, dict[str, Any], str]:
        """Ask the provider for a summary under the intent/settlement rules."""
        run_id = live.state.run_id if live else None
        op_id = new_id()
        instruction = {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": (
                        "Summarize the conversation above for a later continuation: goals, "
                        "decisions, files touched, open work."
                    ),
                }
            ],
        }
        ctx = self.session.context(lane=lane)
        model = (ctx.model or {}).get("modelId") or self.provider.model
        self._commit(
            [
                RecordOp(
                    record(
                        "provider_request_started",
                        lane,
                        run_id,
                        turn=0,
                        attempt=1,
                        responseEntryId=op_id,
                        purpose=purpose,
                        provider=self.provider.name,
                        model=model,
                    )
                )
            ],
            live,
        )
        request = ProviderRequest(
            messages=[*messages, instruction], model=model, run_id=run_id or "", purpose=purpose
        )
        message = await self._stream(live or _LiveRun(RunState("", lane)), request)
        return text_of(message.get("content")), message, op_id

    async def compact(self, *, lane: str = "main", _live: _LiveRun | None = None) -> dict[str, Any]:
        """Compact the lane's context: summarize what comes before a cut that keeps about
        ``keep_recent_tokens`` of recent context, never inside a tool call's exchange (the cut
        is always at a user message). Returns the compaction entry.

        Raises:
            RunInProgress: called by hand while a run is live on the lane.
        """
        if _live is None and lane in self._runs:
            raise RunInProgress(f"lane {lane!r} has a live run; compaction runs between turns")
        ctx = self.session.context(lane=lane)
        cut = _cut_index(ctx.messages, ctx.entry_ids, self.options.keep_recent_tokens)
        first_kept = ctx.entry_ids[cut] if cut is not None else None
        summarized = ctx.messages[:cut] if cut is not None else ctx.messages
        summary, message, op_id = await self._summarize(lane, summarized, "compaction", _live)
        entry = self._entry(
            lane,
            {
                "type": "compaction",
                "id": op_id,
                "summary": summary,
                "firstKeptEntryId": first_kept,
                "tokensBefore": estimate_tokens(ctx.messages),
                "settings": {"model": ctx.model, "thinkingLevel": ctx.thinking_level},
            },
        )
        run_id = _live.state.run_id if _live else None
        self._commit(
            [
                EntryOp(entry, lane=lane),
                RecordOp(
                    record(
                        "provider_request_finished",
                        lane,
                        run_id,
                        turn=0,
                        attempt=1,
                        purpose="compaction",
                        entryId=entry["id"],
                        responseEntryId=op_id,
                        usage=message.get("usage"),
                        stopReason=message.get("stopReason"),
                    )
                ),
            ],
            _live,
        )
        return entry

    async def navigate(
        self, target_id: str | None, *, lane: str = "main", summarize: bool = True
    ) -> dict[str, Any] | None:
        """Move the lane to ``target_id``; with ``summarize``, append a branch summary of the
        branch being left (a provider request under the intent rules). Returns the summary
        entry, or ``None`` when not summarizing.

        Raises:
            RunInProgress: a run is live on the lane.
            UnknownEntry: the target does not exist.
        """
        self._check_idle(lane)
        if not summarize:
            self.session.navigate(target_id, lane=lane)
            return None
        if target_id is not None:
            self.session.entry(target_id)
        ctx = self.session.context(lane=lane)
        from_id = self.session.leaf(lane)
        summary, message, op_id = await self._summarize(lane, ctx.messages, "branch_summary", None)
        entry = self.session.make_entry(
            {"type": "branch_summary", "id": op_id, "fromId": from_id or "", "summary": summary},
            parent_id=target_id,
        )
        self._commit(
            [
                EntryOp(entry, lane=lane),
                RecordOp(
                    record(
                        "provider_request_finished",
                        lane,
                        None,
                        turn=0,
                        attempt=1,
                        purpose="branch_summary",
                        entryId=entry["id"],
                        responseEntryId=op_id,
                        usage=message.get("usage"),
                        stopReason=message.get("stopReason"),
                    )
                ),
            ]
        )
        return entry


def _user_message(text: str | dict[str, Any]) -> dict[str, Any]:
    """A user-role message from text, or a caller's message dict validated at acceptance.

    Raises:
        FormatError: the dict is not a valid message (nothing is written).
    """
    if isinstance(text, dict):
        return validate_message({"timestamp": now_ms(), **text})
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": now_ms()}


def _is_empty(message: dict[str, Any]) -> bool:
    from durable_harness.session.context import is_empty_assistant

    return is_empty_assistant(message.get("content"))


def _cut_index(
    messages: list[dict[str, Any]], entry_ids: list[str | None], keep_tokens: int
) -> int | None:
    """Index of the first kept message: the latest user message (with an entry id) such that
    the messages from it on fit in ``keep_tokens``. ``None``: keep nothing verbatim."""
    best = None
    for i in range(len(messages) - 1, 0, -1):
        if estimate_tokens(messages[i:]) > keep_tokens:
            break
        if messages[i].get("role") == "user" and entry_ids[i] is not None:
            best = i
    return best


__all__ = [
    "POLICIES",
    "Harness",
    "HarnessOptions",
    "Policy",
    "RunHandle",
    "estimate_tokens",
    "now_iso",
]
