"""The durable run loop's public face: :class:`Harness`.

A :class:`Harness` drives the runs of one session, one open run per lane, writing the lane
operation log as it goes (``design/run-loop.md`` gives the state machine and the write order).
Every public ``async`` verb that accepts input (``prompt``, ``steer``, ``follow_up``,
``next_run``, the setters, ``abort``) returns only after its record is durable. The runs
themselves are driven by :class:`~durable_harness.harness.driver.Driver`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc

from durable_harness import crash
from durable_harness.errors import NoOpenRun, RecoveryError, RunInProgress, StorageError
from durable_harness.harness.core import Event, HarnessCore, HarnessOptions, LiveRun, RunHandle
from durable_harness.harness.driver import Driver, keep_client_key
from durable_harness.harness.records import record
from durable_harness.harness.state import RunState, open_run
from durable_harness.harness.steps import Step
from durable_harness.harness.tool_calls import ToolCalls
from durable_harness.harness.turns import Turns
from durable_harness.ids import new_id, now_ms
from durable_harness.models.entries import validate_message
from durable_harness.providers.base import Provider
from durable_harness.recovery.decisions import decision_ops
from durable_harness.session.session import Session
from durable_harness.storage import codec
from durable_harness.storage.base import EntryOp, RecordOp
from durable_harness.tools.base import Tool, ToolResult


class Harness:
    """Drives the runs of one :class:`Session` (use as ``async with Harness(...) as h``).

    Built by composition: a shared :class:`~durable_harness.harness.core.HarnessCore` (session,
    provider, tools, options, live runs, commits), the run
    :class:`~durable_harness.harness.driver.Driver`, and two components holding the core,
    :attr:`turns` (:class:`~durable_harness.harness.turns.Turns`: provider requests) and
    :attr:`tool_calls` (:class:`~durable_harness.harness.tool_calls.ToolCalls`); the harness
    itself accepts input.

    Args:
        session: an open, writable session.
        provider: the model provider.
        tools: the tools offered to the model (a list or ``{name: tool}``).
        cwd: working directory for tools (default: the session's ``cwd``).
        options: :class:`HarnessOptions`.
        tool_calls: the class of the tool-call component (default
            :class:`~durable_harness.harness.tool_calls.ToolCalls`): a documented hook for
            tests that need a different tool path (the crash matrix's self-test passes a
            deliberately broken one); not for production use.

    Attributes:
        session: the session the harness writes; ``store`` its
            :class:`~durable_harness.storage.base.SessionStore`.
        provider: the model provider; ``tools`` the tools offered, by name.
        cwd: the tools' working directory; ``options`` the run-loop settings.
    """

    def __init__(
        self,
        session: Session,
        provider: Provider,
        tools: list[Tool] | dict[str, Tool] | None = None,
        *,
        cwd: str | Path | None = None,
        options: HarnessOptions | None = None,
        tool_calls: type[ToolCalls] = ToolCalls,
    ) -> None:
        listed = list(tools.values()) if isinstance(tools, dict) else list(tools or [])
        where = Path(cwd or session.cwd or ".")
        core = HarnessCore(session, provider, listed, where, options or HarnessOptions())
        self._core = core
        self.turns = Turns(core)
        self.tool_calls = tool_calls(core)
        self._driver = Driver(core, self.turns, self.tool_calls)
        self.session, self.store, self.provider = session, core.store, provider
        self.tools, self.cwd, self.options = core.tools, core.cwd, core.options

    @property
    def task_group(self) -> anyio.abc.TaskGroup | None:
        """The task group the runs are driven in (``None`` outside ``async with``)."""
        return self._core.tg

    async def __aenter__(self) -> Self:
        self._core.tg = anyio.create_task_group()
        await self._core.tg.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool | None:
        tg = self._core.tg
        assert tg is not None
        try:
            return await tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # An error raised in the body of `async with Harness(...)` (e.g. LaneSuspended from
            # prompt()) comes back wrapped by the task group: hand the caller the error itself.
            if exc is not None and len(group.exceptions) == 1 and group.exceptions[0] is exc:
                raise exc from None
            raise
        finally:
            self._core.tg = None

    def subscribe(self, callback: Callable[[Event], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns an unsubscribe function.

        Events: ``run_start``, ``turn_start``, ``provider_request_start``, ``message_start``,
        ``message_update``, ``message_end``, ``provider_request_end``, ``tool_execution_start``,
        ``tool_execution_end``, ``turn_end``, ``suspended``, ``tool_process_killed``,
        ``run_end``, ``queue_update``. Each is a dict with ``type``, ``lane`` and ``runId``
        (``design/observability.md`` lists every event's fields). The callback runs inside the
        run loop: it must be fast and must not raise.
        """
        return self._core.subscribe(callback)

    # -- accepting input -------------------------------------------------------------------

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
        self._core.check_idle(lane)
        message = _user_message(text)
        handle = self._driver.start_run(lane, message, consumed=None, client_key=client_key)
        await self._core.barrier()
        return handle

    async def _enqueue(
        self, queue: str, text: str | dict[str, Any], lane: str, client_key: str | None = None
    ) -> str:
        message = _user_message(text)
        run = self._core.runs.get(lane)
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
        keep_client_key(rec, client_key)
        self._core.commit([RecordOp(rec)], run)
        await self._core.barrier()
        crash.crash_point("after_queue_enqueued")
        self._core.emit("queue_update", run, lane=lane, queue=queue, itemId=item_id)
        if queue == "next_run" and run is None and self.session.lane(lane).run_id is None:
            self._driver.start_next(lane)
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
        run = self._core.runs.get(lane)
        if run is None:
            self._core.commit([EntryOp(self._core.entry(lane, write), lane=lane)])
        else:
            rec = record("write_deferred", lane, run.state.run_id, write=write)
            keep_client_key(rec, client_key)
            self._core.commit([RecordOp(rec)], run)
        await self._core.barrier()

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

    async def abort(
        self, *, lane: str = "main", grace: float | None = None
    ) -> list[dict[str, Any]]:
        """Abort the lane's run: ``abort_requested`` is durable before the signal; the provider
        stream and running tools are cancelled; the run settles ``aborted``. Returns the steer and
        follow-up messages that were cancelled (next-run items and deferred writes survive).
        ``grace``: seconds a cancelled tool has to stop its processes (default ``ABORT_GRACE``,
        1 s; a host's close passes its ``close_grace``).

        Raises:
            NoOpenRun: no live run on the lane.
        """
        live = self._core.runs.get(lane)
        if live is None:
            raise NoOpenRun(f"no live run on lane {lane!r} of session {self.session.id}")
        if not live.state.abort_requested:
            self._core.commit([RecordOp(record("abort_requested", lane, live.state.run_id))], live)
            await self._core.barrier()
            crash.crash_point("after_abort_requested")
        if grace is not None:
            self._core.stop_grace = grace
        if live.scope is not None:
            live.scope.cancel()
        await live.done.wait()
        return live.returned

    def fence(self) -> None:
        """The kill step of a close (``design/host.md``): from now on this harness writes
        nothing, neither a tool's result arriving late nor an aborted run's settlement, so a
        call still running stays in doubt, as after a crash. Irreversible."""
        try:  # a settlement held for the next commit was made before the kill step
            self._core.flush()
        except StorageError:
            self._core.drop_held()  # as if the process had died before writing it
        self._core.fenced = True

    def record(self, *records: dict[str, Any]) -> None:
        """Commit what the host records of the session this harness writes (its
        ``session_lifecycle`` and ``tool_permission`` records), durable on return, so a live
        session has one writer. Not fenced: the close that fenced the harness records
        ``closed`` through it."""
        self._core.flush()  # after what the harness holds, in order
        self.store.commit([RecordOp(r) for r in records])

    # -- compaction and navigation ---------------------------------------------------------

    async def compact(self, lane: str = "main") -> dict[str, Any]:
        """Compact the lane's context by hand (between runs): summarize what comes before a
        cut that keeps about ``keep_recent_tokens`` of recent context, never inside a tool
        call's exchange (the cut is always at a user message); the summary is a provider
        request under the intent rules. Returns the compaction entry.

        Raises:
            RunInProgress: a run is live on the lane (runs compact themselves between turns).
            AttemptCapReached, ProviderError: the summary request failed.
        """
        if lane in self._core.runs:
            raise RunInProgress(f"lane {lane!r} has a live run; compaction runs between turns")
        return await self.turns.compact(lane, None)

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
        return await self.turns.navigate(target_id, lane=lane, summarize=summarize)

    # -- resuming --------------------------------------------------------------------------

    def load_run(self, lane: str = "main") -> RunState | None:
        """Fold the lane's open run from storage (``None`` when the lane has none)."""
        return open_run(self.store, self.session.lane(lane))

    async def resume(
        self,
        step: Step,
        *,
        lane: str = "main",
        decisions: Mapping[str, Mapping[str, Any]] | None = None,
        results: Mapping[str, ToolResult] | None = None,
    ) -> RunHandle | None:
        """Continue the lane's interrupted run by executing ``step``, the step the recovery
        plan decided for it (:meth:`durable_harness.recovery.decide.LanePlan.step`; for an idle
        lane ``start_next_run`` or ``none``), then carry on as a live run. ``decisions``
        (``{call key: decision}``, those the plan was computed with) are durable ``decision``
        records before anything acts on them; ``results`` (``{call key: result}``) settle the
        calls the plan reconciles. Returns the run's handle, or ``None`` when nothing started.

        Raises:
            RunInProgress: the lane already has a live run in this harness.
            RecoveryError: the step is for a run the lane does not have open.
        """
        if lane in self._core.runs:
            raise RunInProgress(f"lane {lane!r} already has a live run", lane=lane)
        state = self.load_run(lane)
        if state is None:
            if step.action == "start_next_run":
                self._driver.start_next(lane)
            live_next = self._core.runs.get(lane)
            return RunHandle(live_next) if live_next else None
        if step.action in ("none", "start_next_run"):
            raise RecoveryError(
                f"lane {lane!r} of session {self.session.id} has open run {state.run_id}, "
                f"but the plan's step is {step.action!r}: plan again",
                lane=lane,
            )
        live = LiveRun(state, first=step, results=dict(results or {}))
        open_calls = [c for c in state.tool_calls if c.status != "completed"]
        keyed = {c.key: d for k, d in (decisions or {}).items() if (c := state.call(k))}
        ops = decision_ops(lane, state.run_id, open_calls, keyed)
        if ops:
            self._core.commit(list(ops), live)
        await self._core.barrier()  # every decision is durable before it acts
        return self._driver.launch(live)


def _user_message(text: str | dict[str, Any]) -> dict[str, Any]:
    """A user-role message from text, or a caller's message dict validated at acceptance.
    Lone UTF-16 surrogates become U+FFFD here, as storage writes them
    (:func:`~durable_harness.storage.codec.scrub`), so what the run's events carry, what the
    provider is sent and what is stored are the same text.

    Raises:
        FormatError: the dict is not a valid message (nothing is written).
    """
    if isinstance(text, dict):
        return validate_message(codec.scrub({"timestamp": now_ms(), **text}))
    text = codec.scrub(text)
    return {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": now_ms()}


__all__ = ["Harness", "HarnessOptions", "RunHandle"]
