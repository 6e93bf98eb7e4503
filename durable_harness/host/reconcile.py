"""Start-up reconciliation and recovery of the sessions no generation of this process runs
(``design/host.md``, "The manager"): plan each (the planner of ``durable-harness recover``),
then adopt, resume, or leave it ``suspended`` with its plan; finish an interrupted close.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from durable_harness.errors import DurableHarnessError, LeaseHeld, SessionLive
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


class Reconciler:
    """Plans and recovers the sessions of one manager that no generation here runs, under
    the manager's ``lock`` (lifecycle moves of different sessions never interleave)."""

    def __init__(self, reads: ReadModel, runner: GenerationRunner, lock: anyio.Lock) -> None:
        self.reads = reads
        self.runner = runner
        self.lock = lock

    async def reconcile(self) -> list[SessionRecord]:
        """Read every session (a dead owner's live state becomes ``suspended`` with its plan,
        an interrupted close is finished), then resume per ``options.auto_resume``. Returns
        the records after it."""
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
                    try:
                        await self.resume(rec.id)
                    except (SessionLive, LeaseHeld):
                        continue  # another host took it meanwhile
        return [reads.live[r.id].record if r.id in reads.live else r for r in records]

    async def resume(self, session_id: str, decisions: Decisions | None = None) -> SessionRecord:
        """See :meth:`~durable_harness.host.manager.SessionManager.resume`."""
        async with self.lock:
            rec = await self.reads.read_not_live(session_id, "resuming it")
            lifecycle.check(rec.id, rec.state, "creating")
            if decisions:
                # refused before the lease is taken, so a mistyped id changes nothing (the
                # rule: resolve_decisions; the plan applies it again under the lease)
                with self.reads.open_read(session_id) as store:
                    tools = declarations(self.reads.options.tools(rec.command_runtime))
                    resolve_decisions(take_snapshot(store), decisions, tools)
            store = open_writable(self.reads.store, session_id, rec.mode)
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
        if not start or needs_decision(recovery.plan):
            commit_decisions(store, recovery.plan, recovery.decisions)
            session.close()
            return await self.reads.read(rec.id)
        rec.generation = store.generation
        rec.state = "creating"
        rec.last_error = None
        await self.runner.start(rec, session, recovery, None)
        return rec

    async def close_stored(self, session_id: str) -> SessionRecord:
        """Close a session no generation here runs: under its lease, kill the live groups its
        dead generation left, then write ``closed`` (a closed one with no live group is left
        as it is)."""
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
