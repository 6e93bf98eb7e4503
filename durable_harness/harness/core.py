"""The harness core: options, run handles, events, commits and durability barriers.

Shared by the run-loop modules (:mod:`.harness`, :mod:`.turns`, :mod:`.tool_calls`); it
writes nothing by itself except through :meth:`HarnessCore._commit`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

import anyio

from durable_harness.errors import (
    LaneSuspended,
    RunInProgress,
)
from durable_harness.harness.state import (
    LaneLog,
    RunLimits,
    RunState,
    fold_lane,
)
from durable_harness.harness.steps import Step
from durable_harness.providers.base import (
    Provider,
)
from durable_harness.session.session import Session
from durable_harness.storage.base import Op, RecordOp
from durable_harness.tools.base import Tool, ToolResult

Event = dict[str, Any]


@dataclass
class HarnessOptions:
    """Run-loop settings.

    Attributes:
        system_prompt: system text sent with every request.
        attempt_cap: provider attempts per turn (and per summary), counted durably across
            restarts.
        retry_initial, retry_max: exponential backoff between attempts, in seconds.
        max_turns: turns per run before the run fails (a runaway guard).
        max_tool_calls: tool calls per run before the run fails (a runaway guard).
            ``attempt_cap``, ``max_turns`` and ``max_tool_calls`` are recorded in each run's
            ``run_started`` and a resumed run keeps the values it started with.
        compact_reserve: tokens kept free in the context window; auto-compaction triggers at
            a checkpoint when the estimated context exceeds ``context_window - compact_reserve``.
        keep_recent_tokens: tokens of recent context a compaction keeps verbatim.
    """

    system_prompt: str | None = None
    attempt_cap: int = 5
    retry_initial: float = 0.2
    retry_max: float = 5.0
    max_turns: int = 50
    max_tool_calls: int = 500
    compact_reserve: int = 16_384
    keep_recent_tokens: int = 20_000
    provider_spec: str | None = None

    @property
    def limits(self) -> RunLimits:
        """The bounds a new run records (:class:`RunLimits`)."""
        return RunLimits(self.attempt_cap, self.max_turns, self.max_tool_calls)


@dataclass
class _LiveRun:
    state: RunState
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None
    partial: list[dict[str, Any]] = field(default_factory=list)
    returned: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    waiting: list[str] = field(default_factory=list)
    #: the recovery step to execute first (``None`` for a new run), and the results its
    #: ``reconcile`` actions settle with, by call key
    first: Step | None = None
    results: dict[str, ToolResult] = field(default_factory=dict)


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


class HarnessCore:
    """State and helpers shared by the run-loop mixins; use :class:`Harness`."""

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

    async def __aenter__(self) -> Self:
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

        The commit is written, not yet fsynced: :meth:`_barrier` makes it durable, and the
        harness calls it before every effect (a provider request, a tool) and before a verb
        that accepted input returns (or a run settles). Write-ahead therefore holds with one
        fsync per boundary: a settlement rides on the fsync of the next intent. ``sync`` mode
        fsyncs at each barrier; ``batch`` shares one fsync among concurrent barriers.
        """
        self.store.commit(ops, wait=False)
        for op in ops:
            if isinstance(op, RecordOp):
                rec = op.record
                lane = rec.get("lane")
                if lane is not None:
                    self._lane_log(str(lane)).apply(rec)
                if live is not None and rec.get("runId") == live.state.run_id:
                    live.state.apply(rec, assistant)

    async def _barrier(self) -> None:
        """Wait until every commit so far is durable (a no-op in ``none`` mode)."""
        await self.store.wait_durable_async()

    def _entry(
        self, lane: str, entry: dict[str, Any], *, parent: str | Literal[False] | None = False
    ) -> dict[str, Any]:
        """Prepare an entry appended under the lane's leaf (or ``parent``)."""
        leaf = self.session.leaf(lane) if parent is False else parent
        return self.session.make_entry(entry, parent_id=leaf, validate=False)

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
