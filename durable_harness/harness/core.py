"""The harness core: options, run handles, events, commits and durability barriers.

Shared by the harness's components (:mod:`.harness`, :mod:`.driver`, :mod:`.turns`,
:mod:`.tool_calls`), each of which holds a reference to one :class:`HarnessCore`; nothing is
written except through :meth:`HarnessCore.commit`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from durable_harness.errors import (
    FormatError,
    ProviderError,
    RunInProgress,
    ToolError,
)
from durable_harness.harness.compaction import compaction_budget
from durable_harness.harness.records import record
from durable_harness.harness.state import LaneLog, RunLimits, RunState, fold_lane
from durable_harness.harness.steps import Step
from durable_harness.providers.base import Provider
from durable_harness.providers.choice import request_model
from durable_harness.session.context import Context
from durable_harness.session.session import Session
from durable_harness.storage.base import EntryOp, Op, RecordOp
from durable_harness.tools.base import ABORT_GRACE, Tool, ToolResult

Event = dict[str, Any]


def _check_plugins(provider: Provider, tools: list[Tool]) -> None:
    """Check, once, the values a provider and the tools contribute to records (the
    records built from them are not re-checked at commit: :mod:`~durable_harness.harness.
    records`).

    Raises:
        ProviderError: the provider's ``name`` or ``model`` is not a string.
        ToolError: a tool's ``name`` is not a non-empty string, or its ``replay`` is not
            ``"safe"`` or ``"never"``.
    """
    for attr in ("name", "model"):
        value = getattr(provider, attr, None)
        if not isinstance(value, str):
            raise ProviderError(
                f"provider {type(provider).__name__}: {attr} must be a string, "
                f"not {type(value).__name__}"
            )
    for tool in tools:
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not name:
            raise ToolError(f"tool {type(tool).__name__}: name must be a non-empty string")
        replay = getattr(tool, "replay", None)
        if replay not in ("safe", "never"):
            raise ToolError(f"tool {name}: replay must be 'safe' or 'never', not {replay!r}")


@dataclass
class HarnessOptions:
    """Run-loop settings.

    Attributes:
        system_prompt: system text sent with every request.
        attempt_cap: provider attempts per turn (and per summary), counted durably across
            restarts.
        retry_initial, retry_max: exponential backoff between attempts, in seconds.
        max_turns, max_tool_calls: the runaway guards of :class:`RunLimits` (which holds
            their defaults); with ``attempt_cap`` they are recorded in each run's
            ``run_started`` and a resumed run keeps the values it started with.
        compact_reserve: tokens kept free in the context window; auto-compaction triggers at
            a checkpoint when the estimated context exceeds ``context_window - compact_reserve``.
        keep_recent_tokens: tokens of recent context a compaction keeps verbatim; at or
            above ``context_window - compact_reserve`` it is clamped once, when the harness is
            built (:mod:`durable_harness.harness.compaction`).

    Raises:
        FormatError: ``compact_reserve`` or ``keep_recent_tokens`` is negative (names it).
    """

    system_prompt: str | None = None
    attempt_cap: int = RunLimits.attempt_cap
    retry_initial: float = 0.2
    retry_max: float = 5.0
    max_turns: int = RunLimits.max_turns
    max_tool_calls: int = RunLimits.max_tool_calls
    compact_reserve: int = 16_384
    keep_recent_tokens: int = 20_000
    provider_spec: str | None = None

    def __post_init__(self) -> None:
        for name in ("compact_reserve", "keep_recent_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FormatError(
                    f"HarnessOptions.{name} must be a whole number >= 0, not {value!r}"
                )

    @property
    def limits(self) -> RunLimits:
        """The bounds a new run records (:class:`RunLimits`)."""
        return RunLimits(self.attempt_cap, self.max_turns, self.max_tool_calls)


@dataclass
class LiveRun:
    """A run this harness drives: its folded ``state``, ``done`` once it settles or suspends,
    the cancel ``scope`` an abort cancels, the ``partial`` text of the answer streaming now,
    the queue items an abort ``returned``, its ``outcome`` and the calls ``waiting`` for a
    decision."""

    state: RunState
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope | None = None
    #: the text deltas of the answer streaming now, in order (:attr:`partial` joins them
    #: when asked: an answer of n deltas costs O(n), not a join per delta)
    streamed: list[str] = field(default_factory=list)
    returned: list[dict[str, Any]] = field(default_factory=list)
    outcome: str | None = None
    waiting: list[str] = field(default_factory=list)
    #: the recovery step to execute first (``None`` for a new run), and the results its
    #: ``reconcile`` actions settle with, by call key
    first: Step | None = None
    results: dict[str, ToolResult] = field(default_factory=dict)

    @property
    def partial(self) -> list[dict[str, Any]]:
        """The answer streamed so far as content blocks: one text block, or none before any
        text (what an abort keeps, ``design/run-loop.md``)."""
        text = "".join(self.streamed)
        return [{"type": "text", "text": text}] if text else []


class RunHandle:
    """A run accepted by :meth:`Harness.prompt` (or resumed).

    Attributes:
        run_id, lane: identity.
    """

    def __init__(self, live: LiveRun) -> None:
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


class Suspend(Exception):
    """Raised inside a run that waits for a decision: the driver ends it as ``suspended``."""


class HarnessCore:
    """What the components of one :class:`~durable_harness.harness.harness.Harness` share
    (internal): the session, provider, tools and options, the live runs, the folded lane logs,
    the event subscribers and the task group; and the only way they write (:meth:`commit`,
    made durable by :meth:`barrier`)."""

    def __init__(
        self,
        session: Session,
        provider: Provider,
        tools: list[Tool],
        cwd: Path,
        options: HarnessOptions,
    ) -> None:
        self.session = session
        self.store = session.store
        self.provider = provider
        _check_plugins(provider, tools)
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.specs = [t.spec() for t in tools]
        self.cwd = cwd
        self.options = options
        self.compaction = compaction_budget(
            provider.context_window, self.options.compact_reserve, self.options.keep_recent_tokens
        )
        self.runs: dict[str, LiveRun] = {}
        self.lanes: dict[str, LaneLog] = {}
        self.subscribers: list[Callable[[Event], Any]] = []
        self.tg: anyio.abc.TaskGroup | None = None
        #: seconds a cancelled tool has to stop before it kills (``ToolContext.grace``)
        self.stop_grace = ABORT_GRACE
        #: set by :meth:`Harness.fence` (a close's kill step): nothing more is written
        self.fenced = False
        #: events emitted while a held commit is not written yet, sent once it is
        self._held_events: list[Event] = []
        self._holding = False

    # -- events ----------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Event], Any]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns an unsubscribe function."""
        self.subscribers.append(callback)
        return lambda: self.subscribers.remove(callback)

    def emit(self, etype: str, live: LiveRun | None, **fields: Any) -> None:
        """Send an event of type ``etype`` (with the run's ``lane`` and ``runId``, if any) to
        every subscriber; while a held commit is not written (:meth:`commit`), once it is, so
        an event never reports what the store does not hold yet."""
        subscribers = self.subscribers
        if not subscribers:
            return
        event = {"type": etype, **fields}
        if live is not None:
            state = live.state
            if "lane" not in event:
                event["lane"] = state.lane
            if "runId" not in event:
                event["runId"] = state.run_id
        if self._holding:
            self._held_events.append(event)
            return
        # _send, inlined (about 11 events a turn); a copy of the list only when there is more
        # than one subscriber, so one may unsubscribe another while the event is sent
        if len(subscribers) == 1:
            subscribers[0](event)
        else:
            for cb in list(subscribers):
                cb(event)

    def _send(self, event: Event) -> None:
        for cb in list(self.subscribers):
            cb(event)

    # -- commits ---------------------------------------------------------------------------

    def lane_log(self, lane: str) -> LaneLog:
        """The lane's folded log (folded from storage once, then kept up to date by
        :meth:`commit`)."""
        if lane not in self.lanes:
            self.lanes[lane] = fold_lane(self.store.records(lane))
        return self.lanes[lane]

    def commit(
        self,
        ops: list[Op],
        live: LiveRun | None = None,
        assistant: dict[str, Any] | None = None,
        *,
        hold: bool = False,
    ) -> None:
        """Commit ``ops``, then fold its records into the run and lane state.

        The commit is written, not yet fsynced: :meth:`barrier` makes it durable, and the
        harness calls it before every effect (a provider request, a tool) and before a verb
        that accepted input returns (or a run settles). Write-ahead therefore holds with one
        fsync per boundary: a settlement rides on the fsync of the next intent. ``sync`` mode
        fsyncs at each barrier; ``batch`` shares one fsync among concurrent barriers.

        ``hold=True`` (a settlement the next intent follows with no effect and no wait in
        between): fold now, write with the next commit, in the same transaction
        (:meth:`Session.stage <durable_harness.session.session.Session.stage>`,
        ``design/run-loop.md`` "Merged commits"); :meth:`barrier` writes it at the latest.

        Once fenced (:meth:`Harness.fence`) it writes nothing: what a run does after a
        close's kill step is dropped, as if the process had died then.
        """
        if self.fenced:
            return
        if hold:
            self.session.stage(ops)
            self._holding = True
        else:
            self._holding = False
            try:
                self.session.commit(ops, wait=False)
            except BaseException:
                self._held_events = []  # they reported what was not written
                raise
        self._fold(ops, live, assistant)
        if self._held_events and not self._holding:
            events, self._held_events = self._held_events, []
            for event in events:
                self._send(event)

    @property
    def holding(self) -> bool:
        """True while a held commit waits for the next (:meth:`commit`)."""
        return self._holding

    def flush(self) -> None:
        """Write a held commit now (nothing if none is held; dropped once fenced)."""
        if self._holding or self.session.staged:
            self.commit([])

    def drop_held(self) -> None:
        """Forget a held commit and the events waiting for it, unwritten (as if the process
        had died before writing it)."""
        self.session.drop_staged()
        self._holding = False
        self._held_events = []

    def _fold(self, ops: list[Op], live: LiveRun | None, assistant: dict[str, Any] | None) -> None:
        lanes, folded = self.lanes, LaneLog.FOLDED
        run = live.state if live is not None else None
        for op in ops:
            if isinstance(op, RecordOp):
                rec = op.record
                lane = rec.get("lane")
                if lane is not None:
                    # the lane's log is folded from storage the first time a record names it,
                    # whatever its type; a type it does not read is not handed to it
                    lane_log = lanes.get(lane) if type(lane) is str else None
                    if lane_log is None:
                        lane_log = self.lane_log(str(lane))
                    if rec.get("type") in folded:
                        lane_log.apply(rec)
                if run is not None and rec.get("runId") == run.run_id:
                    run.apply(rec, assistant)

    async def barrier(self) -> None:
        """Write a held commit, then wait until every commit so far is durable (a no-op in
        ``none`` mode, or fenced)."""
        if self.fenced:
            return
        self.flush()
        await self.store.wait_durable_async()

    def entry(
        self, lane: str, entry: dict[str, Any], *, parent: str | Literal[False] | None = False
    ) -> dict[str, Any]:
        """Prepare an entry appended under the lane's leaf (or ``parent``)."""
        leaf = self.session.leaf(lane) if parent is False else parent
        return self.session.make_entry(entry, parent_id=leaf, validate=False)

    def model(self, lane: str, ctx: Context | None = None) -> str:
        """The model a request on ``lane`` names (:func:`~durable_harness.providers.choice.
        request_model`: the session's, when of this provider's family); ``ctx``: the lane's
        context, when the caller has just built it."""
        session_model = (ctx or self.session.context(lane=lane)).model
        return request_model(self.provider.name, self.provider.model, session_model)

    def deferred_ops(self, lane: str, leaf: str | None) -> tuple[list[Op], list[str]]:
        """The entries applying the lane's deferred writes, chained under ``leaf``, and the
        ids of the ``write_deferred`` records they apply (a save point's or a run's
        ``appliedWrites``)."""
        ops: list[Op] = []
        applied: list[str] = []
        for rec in self.lane_log(lane).deferred:
            entry = self.entry(lane, dict(rec["write"]), parent=leaf)
            ops.append(EntryOp(entry, lane=lane))
            applied.append(rec["id"])
            leaf = entry["id"]
        return ops, applied

    def finish_ops(self, live: LiveRun, outcome: str, leaf: str | None, **extra: Any) -> list[Op]:
        """What settles a run: its deferred writes applied (under ``leaf``), then
        ``run_finished`` with ``outcome`` (and ``extra`` fields: ``reason``)."""
        s = live.state
        ops, applied = self.deferred_ops(s.lane, leaf)
        rec = record(
            "run_finished", s.lane, s.run_id, outcome=outcome, appliedWrites=applied, **extra
        )
        return [*ops, RecordOp(rec)]

    def check_idle(self, lane: str) -> None:
        """Raise unless the lane has neither a live run nor an interrupted one.

        Raises:
            RunInProgress: the lane has a live run in this harness.
            LaneSuspended: the lane has an interrupted run waiting for recovery.
        """
        if lane in self.runs:
            raise RunInProgress(
                f"lane {lane!r} of session {self.session.id} already has run "
                f"{self.runs[lane].state.run_id}",
                lane=lane,
            )
        self.session.check_no_open_run(lane)
