"""Start-up reconciliation and recovery of the sessions no generation of this process runs
(``design/host.md``, "The manager"): plan each (the planner of ``durable-harness recover``),
then adopt, resume (the start-up resumes in the background, after the manager serves: "Plans
first, then serve, then resume"), or leave it ``suspended`` with its plan; finish an
interrupted close.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

import anyio

from durable_harness import logs
from durable_harness.errors import (
    DurableHarnessError,
    IllegalTransition,
    LeaseHeld,
    SessionLive,
    root_cause,
)
from durable_harness.harness.groups import kill_and_record, kill_groups, open_calls
from durable_harness.host import lifecycle, worker
from durable_harness.host.leftovers import open_writable
from durable_harness.host.options import needs_decision
from durable_harness.host.read_model import ReadModel
from durable_harness.host.record import SessionRecord, lifecycle_record, read_record
from durable_harness.host.runner import GenerationRunner
from durable_harness.recovery.decide import resolve_decisions
from durable_harness.recovery.decisions import commit_decisions
from durable_harness.recovery.resume import declarations, plan_recovery
from durable_harness.recovery.snapshot import take_snapshot
from durable_harness.session.session import Session
from durable_harness.storage.base import RecordOp, SessionStore

Decisions = Mapping[str, Mapping[str, Any]]
"""``{tool call id or call key: {"decision": "retry"|"fail"|"result", "result": text}}``."""

log = logging.getLogger("durable_harness.host.reconcile")


class Reconciler:
    """Plans and recovers the sessions of one manager that no generation here runs, under
    the manager's ``lock`` (lifecycle moves of different sessions never interleave).

    The start-up resumes run in the background (:meth:`reconcile`): the ids queued are
    ``reads.pending`` (in order), taken by ``options.resume_concurrency`` tasks on the
    runner's task group until the queue is empty or :meth:`stop`.
    """

    def __init__(self, reads: ReadModel, runner: GenerationRunner, lock: anyio.Lock) -> None:
        self.reads = reads
        self.runner = runner
        self.lock = lock
        self._queue: deque[str] = deque()
        # made when the background resumes start (both need the event loop)
        self._scope: anyio.CancelScope | None = None
        self._drained: anyio.Event | None = None  # set once the background resumes end

    async def reconcile(self) -> list[SessionRecord]:
        """Read every session (a dead owner's live state becomes ``suspended`` with its plan,
        an interrupted close is finished), then, with ``options.auto_resume ==
        "no_decision"``, queue each suspended one whose plan needs no decision for a resume
        in the background (started on the runner's task group; returns before any of them
        begins). Returns the records read (a queued one ``suspended``)."""
        reads = self.reads
        reads.unreadable = []
        records: list[SessionRecord] = []
        for info in reads.store.list_sessions():
            if info.error:
                reads.unreadable.append({"id": info.id, "path": info.path, "error": info.error})
                continue
            if info.id in reads.live:
                records.append(reads.live[info.id].record)
                continue
            try:
                rec = await reads.read(info.id)
                if rec.state == "closed" and reads.live_groups(info.id):
                    rec = await self.close_stored(info.id)  # a close a crash interrupted
                records.append(rec)
            except (SessionLive, LeaseHeld):
                records.append(await reads.read(info.id))  # another host took it meanwhile
            except DurableHarnessError as exc:
                reads.unreadable.append({"id": info.id, "path": info.path, "error": exc.to_json()})
        if reads.options.auto_resume == "no_decision":
            for rec in records:
                plan = reads.plans.get(rec.id)
                if rec.state == "suspended" and plan is not None and not needs_decision(plan):
                    self._enqueue(rec.id)
        if self._queue and self.runner.tg is not None:
            self._scope, self._drained = anyio.CancelScope(), anyio.Event()
            self.runner.tg.start_soon(self._resume_queued, self._scope, self._drained)
        return [reads.live[r.id].record if r.id in reads.live else r for r in records]

    # -- the background resumes -------------------------------------------------------------

    def _enqueue(self, session_id: str) -> None:
        """Queue a start-up resume of ``session_id`` and tell the observers."""
        self.reads.pending[session_id] = None
        self._queue.append(session_id)
        position = len(self.reads.pending)
        self._publish(session_id, {"state": "suspended", "resume_pending": position})

    def _unqueue(self, session_id: str, state: str) -> None:
        """``session_id`` leaves the queue (its resume begins, or a close or a failure
        came first): tell the observers, its state being ``state``."""
        if self.reads.pending.pop(session_id, False) is None:
            self._publish(session_id, {"state": state, "resume_pending": None})

    def _publish(self, session_id: str, event: dict[str, Any]) -> None:
        """A ``lifecycle`` event of a session with no generation, to the manager's
        observers (an observer that raises is logged, as the runner's are not reached)."""
        for observer in self.runner.observers:
            try:
                observer(session_id, {"type": "lifecycle", **event})
            except Exception:
                log.exception("an observer failed on session %s", session_id)

    async def _resume_queued(self, scope: anyio.CancelScope, drained: anyio.Event) -> None:
        """The background resumes: ``resume_concurrency`` tasks drain the queue."""
        try:
            with scope:
                width = max(1, self.reads.options.resume_concurrency)
                async with anyio.create_task_group() as tg:
                    for _ in range(min(width, len(self._queue))):
                        tg.start_soon(self._drain)
        finally:
            drained.set()

    async def _drain(self) -> None:
        while self._queue:
            sid = self._queue.popleft()
            if sid not in self.reads.pending:
                continue  # closed or resumed by a client meanwhile
            with anyio.CancelScope(shield=True):  # a stop lands between resumes, not inside
                await self._resume_one(sid)
            await anyio.sleep(0)  # let requests in between two resumes

    async def _resume_one(self, session_id: str) -> None:
        """One queued resume; whatever it raises is logged and the session stays as the
        store has it (a background task never takes the manager down)."""
        try:
            await self._resume(session_id, None, queued=True)
        except (SessionLive, LeaseHeld, IllegalTransition):
            pass  # another host holds it, or its state moved: nothing for the queue to do
        except Exception as exc:
            cause = root_cause(exc)
            logs.event(
                log,
                "resume_failed",
                "session %s: the start-up resume failed: %s",
                session_id,
                cause,
                level=logging.WARNING,
                session_id=session_id,
                code=getattr(cause, "code", "internal"),
            )
        finally:
            if session_id in self.reads.pending:
                rec = self.reads.live.get(session_id)
                self._unqueue(session_id, rec.record.state if rec else "suspended")

    async def stop(self) -> None:
        """Stop the background resumes: the queue is dropped, a resume in progress finishes
        (its generation then stops with the others); returns once none runs. Idempotent."""
        if self._scope is not None:
            self._scope.cancel()
        self._queue.clear()
        for sid in list(self.reads.pending):
            self._unqueue(sid, "suspended")
        if self._drained is not None:
            await self._drained.wait()

    async def wait_resumed(self) -> None:
        """Return once the background resumes have ended (at once when none was queued)."""
        if self._drained is not None:
            await self._drained.wait()

    # -- the verbs --------------------------------------------------------------------------

    async def resume(self, session_id: str, decisions: Decisions | None = None) -> SessionRecord:
        """See :meth:`~durable_harness.host.manager.SessionManager.resume`. A session whose
        start-up resume is queued leaves the queue at once: this resume is the one, done
        as soon as the lock is free (a resume already in progress: ``SessionLive``)."""
        if decisions is None:
            self._unqueue(session_id, "suspended")
        rec = await self._resume(session_id, decisions)
        assert rec is not None  # only a queued resume is skipped
        return rec

    async def _resume(
        self, session_id: str, decisions: Decisions | None, *, queued: bool = False
    ) -> SessionRecord | None:
        """:meth:`resume`; ``queued``: the background's, skipped (``None``) when the
        session left the queue while it waited for the lock."""
        async with self.lock:
            if queued and session_id not in self.reads.pending:
                return None
            rec = await self.reads.read_not_live(session_id, "resuming it")
            lifecycle.check(rec.id, rec.state, "creating")
            if decisions:
                # refused before the lease is taken, so a mistyped id changes nothing (the
                # rule: resolve_decisions; the plan applies it again under the lease)
                with self.reads.open_read(session_id) as store:
                    tools = declarations(self.reads.options.tools(rec.command_runtime))
                    resolve_decisions(take_snapshot(store), decisions, tools)
            store = open_writable(self.reads.store, session_id, rec.mode)
            self._unqueue(session_id, rec.state)  # this resume is the one
            return await self._resume_held(rec, store, decisions)

    async def adopt(self, store: SessionStore) -> SessionRecord:
        """See :meth:`~durable_harness.host.manager.SessionManager.adopt`."""
        async with self.lock:
            sid = store.session_id
            old = self.reads.live.get(sid)
            if old is not None:  # a generation of ours the claim fenced out (it was paused)
                old.scope.cancel()
                await old.stopped.wait()
            try:
                rec = read_record(store, self.reads.store.spec, owner_alive=False)
                store.durability = rec.mode
                if rec.client_key:
                    self.reads.keys.setdefault(rec.client_key, rec.id)
            except BaseException as exc:
                await worker.let_go(store, lost=worker.writer_lost(exc, store))
                raise
            if rec.state != "suspended":  # a crash after `closed`, before the release
                store.close()
                return await self.reads.read(sid)
            try:  # the dead worker's groups on this machine die before the plan
                kill_and_record(store, "claim")
            except BaseException:
                await worker.let_go(store)
                raise
            start = self.reads.options.auto_resume == "no_decision"
            self._unqueue(sid, rec.state)  # the claim resumes it, if the queue had it too
            return await self._resume_held(rec, store, None, start=start)

    async def _resume_held(
        self,
        rec: SessionRecord,
        store: SessionStore,
        decisions: Decisions | None,
        *,
        start: bool = True,
    ) -> SessionRecord:
        """Plan ``rec``'s session on ``store`` (lease held) and start its next generation;
        when the plan needs a decision (or not ``start``), record the decisions, release
        the lease and leave it suspended."""
        session = Session(store)
        options = self.reads.options
        try:
            recovery = await plan_recovery(
                store,
                options.tools(rec.command_runtime),
                options.policy,
                decisions,
                rec.cwd or None,
            )
        except BaseException as exc:
            await worker.let_go(store, lost=worker.writer_lost(exc, store))
            raise
        for key, given in recovery.decisions.items():
            logs.event(
                log,
                "decision",
                "session %s: decision %s for tool call %s",
                rec.id,
                given.get("decision"),
                key,
                announce=True,
                session_id=rec.id,
                call_key=key,
                decision=given.get("decision"),
            )
        if not start or needs_decision(recovery.plan):
            commit_decisions(store, recovery.plan, recovery.decisions)
            session.close()
            waiting = [c.tool_call_id for lp in recovery.plan.lanes for c in lp.waiting()]
            logs.event(
                log,
                "resume_waits",
                "session %s: not resumed, %s call(s) in doubt wait for a decision",
                rec.id,
                len(waiting),
                announce=True,
                session_id=rec.id,
                awaiting=waiting,
            )
            return await self.reads.read(rec.id)
        rec.generation = store.generation
        rec.state = "creating"
        rec.last_error = None
        await self.runner.start(rec, session, recovery, None)
        resumed = [lp for lp in recovery.plan.lanes if lp.next_action != "none"]
        logs.event(
            log,
            "resume",
            "session %s: resumed as generation %s (%s)",
            rec.id,
            rec.generation,
            ", ".join(f"{lp.lane}: {lp.next_action}" for lp in resumed) or "nothing to redo",
            announce=True,
            session_id=rec.id,
            generation=rec.generation,
            lanes={lp.lane: lp.next_action for lp in resumed},
            run_id=resumed[0].run_id if len(resumed) == 1 else None,
            lane=resumed[0].lane if len(resumed) == 1 else None,
        )
        return rec

    async def close_stored(self, session_id: str) -> SessionRecord:
        """Close a session no generation here runs: under its lease, kill the live groups its
        dead generation left, then write ``closed`` (a closed one with no live group is left
        as it is). A queued start-up resume of it is dropped first: the close wins."""
        self._unqueue(session_id, "suspended")
        async with self.lock:
            rec = await self.reads.read_not_live(session_id, "closing it")
            if rec.state == "closed" and not self.reads.live_groups(session_id):
                return rec
            lifecycle.check(rec.id, rec.state, "closed")
            with open_writable(self.reads.store, session_id, rec.mode) as store:
                # the lease proves the generation that started them dead: nothing else will
                kill_groups(open_calls(store), session_id)
                rec.generation = store.generation
                store.commit([RecordOp(lifecycle_record(rec, "closed"))])
            return await self.reads.read(session_id)
