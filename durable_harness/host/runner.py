"""The generation runner: the life of one session process, from the start of a runtime
generation to the release of its lease (``design/host.md``).

:class:`GenerationRunner` starts each generation in the manager's task group (the harness,
the recovery plan executed lane by lane, the control endpoint), follows its events (which
lanes run), moves its lifecycle state (the only place a live generation's state moves:
:func:`~durable_harness.host.lifecycle.check`), and ends it: ``closed`` written when it was
closing, the store let go of (handed back on a worker), the process forgotten.

The close of a live generation is staged and bounded (``design/host.md``, "Closing"):

1. **Abort.** Every running lane is aborted with ``grace = close_grace``: ``abort_requested``
   is durable, the run is cancelled, a ``bash`` command gets SIGINT (pty runtime, its
   terminal's foreground group) and SIGTERM now and SIGKILL when the grace ends.
2. **Grace.** Up to ``close_grace`` seconds (plus :data:`SETTLE_SLACK`, so that a command its
   tool killed at the end of the grace can settle as aborted) for the runs to settle.
3. **Kill step.** The harness is fenced (:meth:`~durable_harness.harness.harness.Harness.
   fence`): nothing more is written to its lane logs, so a tool that ignored cancellation
   and answers later does not have its result recorded, and its call stays in doubt with its
   run open, exactly as after a crash (``recover`` shows it; a resume decides it). Then the
   process groups of unsettled calls are SIGKILLed and the generation is cancelled.
4. **Release.** Up to :data:`STOP_WAIT` seconds for the generation to stop; then ``closed``
   is written and the lease released even if a tool (a thread that cannot be cancelled) is
   still holding the generation's task.

So a close returns within ``close_grace + SETTLE_SLACK + STOP_WAIT`` (< grace + 2 s), plus
the bounded wait for a SIGKILLed group to die.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.abc

from durable_harness.errors import InvalidRequest, NoOpenRun, root_cause
from durable_harness.harness.core import Event
from durable_harness.harness.groups import kill_groups, open_calls
from durable_harness.harness.harness import Harness
from durable_harness.host import lifecycle, worker
from durable_harness.host.lifecycle import LIVE, State
from durable_harness.host.process import SessionProcess
from durable_harness.host.read_model import ReadModel
from durable_harness.host.record import SessionRecord, lifecycle_record
from durable_harness.providers import make_provider
from durable_harness.providers.choice import choose_provider
from durable_harness.recovery.resume import Recovery, recorded_provider_spec, resume_lane
from durable_harness.session.session import Session
from durable_harness.storage.base import RecordOp

SETTLE_SLACK = 0.5
"""Seconds after the grace for a run whose tool stopped at the grace's end to settle."""

STOP_WAIT = 1.0
"""Seconds after the kill step for the generation's task to stop before the close goes on
without it."""

Control = Callable[[str], AbstractAsyncContextManager[int | None]]
"""``session id -> async context manager yielding the generation's control port``."""


class GenerationRunner:
    """Starts, follows and ends the generations of one manager.

    Args:
        reads: the manager's read model (its :attr:`~ReadModel.live` generations are kept
            here).
        control: the control endpoint of each generation, or ``None``.

    Attributes:
        observers: ``(session id, event)`` callbacks given every event of every generation
            started from then on.
        hand_over: set when a worker shuts down: its generations' sessions are handed back
            (``host/worker.py``) instead of closed, so the other workers claim them at once.
    """

    def __init__(self, reads: ReadModel, control: Control | None) -> None:
        self.reads = reads
        self.options = reads.options
        self.control = control
        self.observers: list[Callable[[str, Event], None]] = []
        self.tg: anyio.abc.TaskGroup | None = None
        self.hand_over = False

    def move(self, proc: SessionProcess, state: State) -> None:
        """Enter ``state`` (checked against the lifecycle table) and publish it."""
        rec = proc.record
        if rec.state != state:
            rec.state = lifecycle.check(rec.id, rec.state, state)
            proc.publish({"type": "lifecycle", "state": state})

    def write(self, proc: SessionProcess, state: State, **extra: Any) -> None:
        """Make ``state`` durable (a ``session_lifecycle`` record, through the generation's
        harness: the only writer of a live session; straight to the store before the harness
        is up) and enter it."""
        rec = lifecycle_record(proc.record, state, **extra)
        if proc.harness is not None:
            proc.harness.record(rec)
        else:
            proc.session.store.commit([RecordOp(rec)])
        self.move(proc, state)

    async def start(
        self,
        rec: SessionRecord,
        session: Session,
        recovery: Recovery | None,
        client_key: str | None,
    ) -> None:
        """Start a generation for ``rec`` on ``session`` (open for writing); returns once it
        is up (or has failed and recorded why).

        Raises:
            RuntimeError: the manager is not entered (``async with SessionManager(...)``).
        """
        if self.tg is None:
            session.close()
            raise RuntimeError("use the manager as `async with SessionManager(...)`")
        proc = SessionProcess(rec, session)
        for observer in self.observers:
            proc.observe(partial(observer, rec.id))
        self.reads.live[rec.id] = proc
        self.reads.plans.pop(rec.id, None)
        await self.tg.start(self._generation, proc, recovery, client_key)

    async def _generation(
        self,
        proc: SessionProcess,
        recovery: Recovery | None,
        client_key: str | None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The body of one generation: the harness, then the release of the lease."""
        rec = proc.record
        started = False
        lost = False  # the writer lost the session: fenced out, or the database lost
        try:
            with proc.scope:
                spec = self._provider_spec(proc)
                provider = make_provider(spec, self.options.price)
                options = dataclasses.replace(self.options.harness, provider_spec=spec)
                tools = dict(self.options.tools(rec.command_runtime))
                async with Harness(proc.session, provider, tools, options=options) as harness:
                    proc.harness = harness
                    harness.subscribe(partial(self._on_event, proc))
                    self.write(proc, "idle", client_key=client_key)
                    if recovery is not None:
                        for lane_plan in recovery.plan.lanes:
                            await resume_lane(harness, recovery, lane_plan.lane)
                    async with self._control(proc):
                        started = True
                        task_status.started()
                        await anyio.sleep_forever()
        except Exception as exc:
            cause = root_cause(exc)
            rec.last_error = str(getattr(cause, "message", None) or cause)
            lost = worker.writer_lost(cause, proc.session.store)
            if lost:
                worker.log.warning(
                    "generation %s of session %s stopped: %s",
                    proc.generation,
                    rec.id,
                    rec.last_error,
                )
            elif rec.state != "closing":
                try:
                    self.write(proc, "error", error=rec.last_error)
                except Exception:
                    rec.state = "error"  # the store itself failed: the record says so here
        finally:
            with anyio.CancelScope(shield=True):
                await self.release(proc, lost)
                if not started:
                    task_status.started()

    async def release(self, proc: SessionProcess, lost: bool = False) -> None:
        """End a generation: write ``closed`` if it was closing, let go of the store, forget
        the process. Once only: a close that could not wait for a stuck tool calls it before
        the generation task itself gets there (:meth:`close`)."""
        if proc.releasing:
            return
        proc.releasing = True
        rec = proc.record
        lost = lost or worker.fenced_out(proc.session.store)
        if rec.state == "closing" and not lost:
            try:
                self.write(proc, "closed")
            except Exception as exc:
                rec.last_error = str(root_cause(exc))
                rec.state = "closed"
        elif lost and rec.state in LIVE:
            self.move(proc, "suspended")  # no record: the new owner's is the truth
        if lost:
            self.reads.lost += 1
        await worker.let_go(proc.session.store, lost=lost, hand_over=self.hand_over)
        proc.harness = None
        if self.reads.live.get(rec.id) is proc:
            self.reads.live.pop(rec.id, None)
        proc.end_listeners()
        proc.stopped.set()

    async def close(self, proc: SessionProcess) -> None:
        """Close a live generation in the stages of the module docstring (``closing``
        recorded first); a no-op when it is closing already. Returns once it is released."""
        if proc.record.state != "closing":
            self.write(proc, "closing")
            harness = proc.harness
            grace = self.options.close_grace
            with anyio.move_on_after(grace + SETTLE_SLACK):
                if harness is not None:
                    async with anyio.create_task_group() as tg:
                        for lane in sorted(proc.running):
                            tg.start_soon(_abort, harness, lane, grace)
            if harness is not None:
                harness.fence()
            kill_groups(open_calls(proc.session.store), proc.record.id)
            proc.scope.cancel()
            with anyio.move_on_after(STOP_WAIT):
                await proc.stopped.wait()
            with anyio.CancelScope(shield=True):
                await self.release(proc)  # a no-op if the generation got there first
        await proc.stopped.wait()

    def stop_fenced(self) -> list[str]:
        """Stop every generation whose writer lease another writer took (it was paused or
        cut off past its lease: ``host/worker.py``), writing nothing; returns their ids."""
        fenced = [p for p in self.reads.live.values() if worker.fenced_out(p.session.store)]
        for proc in fenced:
            worker.log.warning(
                "session %s: the lease was taken over by another writer; stopped here",
                proc.record.id,
            )
            proc.scope.cancel()
        return [p.record.id for p in fenced]

    async def stop_all(self) -> None:
        """Stop every live generation without closing its session (as a crash would)."""
        procs = list(self.reads.live.values())
        for proc in procs:
            proc.scope.cancel()
        for proc in procs:
            await proc.stopped.wait()

    @asynccontextmanager
    async def _control(self, proc: SessionProcess) -> AsyncIterator[None]:
        """The generation's control endpoint, if any: its port is runtime state on
        ``proc.port`` while the generation lives, never persisted."""
        if self.control is None:
            yield
            return
        async with self.control(proc.record.id) as port:
            proc.port = port
            try:
                yield
            finally:
                proc.port = None

    def _provider_spec(self, proc: SessionProcess) -> str:
        """The spec a generation runs with (``choose_provider``, the one rule): the session's
        own, else the first lane's recorded one, else the host default."""
        store, rec = proc.session.store, proc.record
        recorded = next(
            filter(None, (recorded_provider_spec(proc.session, n) for n in store.lanes())), None
        )
        choice = choose_provider(rec.provider, recorded, None, self.options.provider)
        if choice is None:
            raise InvalidRequest(f"session {rec.id} has no provider to run with")
        return choice.spec

    def _on_event(self, proc: SessionProcess, event: Event) -> None:
        etype = event.get("type")
        if etype == "run_start":
            proc.running.add(str(event.get("lane")))
        elif etype == "run_end":
            proc.running.discard(str(event.get("lane")))
            proc.ended.append(str(event.get("runId")))
        proc.publish(event)
        if proc.record.state in LIVE:
            self.move(proc, "running" if proc.running else "idle")


async def _abort(harness: Harness, lane: str, grace: float) -> None:
    try:
        await harness.abort(lane=lane, grace=grace)
    except NoOpenRun:
        pass
