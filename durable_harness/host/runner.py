"""The generation runner: one session process's life, from the start of a runtime
generation to the release of its lease (``design/host.md``, "The manager"; the staged close:
**close** there).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.abc

from durable_harness import logs
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
    """Starts, follows and ends the generations of one manager; the only place a live
    generation's state moves (:func:`~durable_harness.host.lifecycle.check`).

    Attributes:
        observers: ``(session id, event)`` callbacks for every event of later generations.
        hand_over: a worker shutting down: sessions are handed back, not closed.
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
            self.reads.changes.bump(rec.id)

    def write(self, proc: SessionProcess, state: State, **extra: Any) -> None:
        """Make ``state`` durable (a ``session_lifecycle`` record, through the harness once it
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
        is up or has failed and recorded why.

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
                logs.event(
                    worker.log,
                    "generation_error",
                    "session %s: generation %s stopped on an error: %s",
                    rec.id,
                    proc.generation,
                    rec.last_error,
                    level=logging.WARNING,
                    session_id=rec.id,
                    generation=proc.generation,
                    code=getattr(cause, "code", "internal"),
                )
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
        """End a generation once: write ``closed`` if it was closing, let go of the store,
        forget the process (a close that gave up waiting calls it before the task does)."""
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
        self.reads.changes.bump(rec.id)
        proc.end_listeners()
        proc.stopped.set()

    async def close(self, proc: SessionProcess) -> None:
        """Close a live generation in stages (abort, grace, kill step, release:
        ``design/host.md``, **close**); returns once it is released."""
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
        """Stop every generation whose writer lease another writer took, writing nothing;
        returns their ids."""
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
        """The generation's control endpoint, if any (``proc.port`` while it lives)."""
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
        """The spec a generation runs with (``choose_provider``): the session's own, else the
        first lane's recorded one, else the host default."""
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
