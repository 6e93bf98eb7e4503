"""The session manager: many durable sessions in one process (``design/host.md``).

:class:`SessionManager` owns the session processes (one runtime generation each) of one store
and is the only place their lifecycle moves (:func:`durable_harness.host.lifecycle.check`).
It is built on the library's public pieces: :func:`~durable_harness.storage.open_store`,
:class:`~durable_harness.Session`, :class:`~durable_harness.Harness`, the recovery planner
(:func:`~durable_harness.recovery.resume.plan_recovery`) and
:func:`~durable_harness.recovery.resume.resume_lane`, which executes exactly the plan.

Use it as ``async with SessionManager(store, options) as manager:``; entering it reconciles
the store (every session whose owner died becomes ``suspended`` with its plan, and those whose
plan needs no decision are resumed when ``options.auto_resume`` says so) before it returns.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Self, cast

import anyio
import anyio.abc

from durable_harness.errors import (
    DurableHarnessError,
    IdempotencyKeyReused,
    IllegalTransition,
    InvalidRequest,
    LeaseHeld,
    MessageTooLarge,
    RunInProgress,
    SessionLive,
    SessionNotFound,
    SessionNotLive,
    ToolProcessRunning,
    root_cause,
)
from durable_harness.harness.core import Event
from durable_harness.harness.groups import kill_and_record, kill_groups, live_groups, open_calls
from durable_harness.harness.harness import Harness
from durable_harness.host import lifecycle, worker
from durable_harness.host.closing import staged_close
from durable_harness.host.inputs import (
    SESSION_ID,
    check_key,
    check_lane,
    check_root,
    check_same_send,
    check_text,
    check_unicode,
    working_directory,
)
from durable_harness.host.leftovers import (
    kill_call_group,
    kill_stored_leftovers,
    open_for_kill,
    plan_sees_live_group,
)
from durable_harness.host.lifecycle import LIVE, State
from durable_harness.host.listing import check_states, read_listed, waiting_calls
from durable_harness.host.options import (
    HostOptions,
    SendMode,
    needs_decision,
)
from durable_harness.host.process import SessionProcess
from durable_harness.host.record import (
    SessionRecord,
    lifecycle_record,
    permission_record,
    read_record,
)
from durable_harness.host.views import (
    acceptance,
    asks_hooks,
    copy_record,
    log_page,
    sees_live_group,
    status_view,
    transcript_page,
)
from durable_harness.models.records import COMMAND_RUNTIMES
from durable_harness.providers import make_provider, require_credentials
from durable_harness.providers.choice import choose_provider
from durable_harness.recovery.decide import RecoveryPlan, refuse_decided, resolve_decisions
from durable_harness.recovery.decisions import commit_decisions
from durable_harness.recovery.resume import (
    Recovery,
    declarations,
    parse_decision,
    plan_recovery,
    recorded_provider_spec,
    resume_lane,
)
from durable_harness.recovery.snapshot import take_snapshot
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.storage.base import DURABILITY_MODES, Durability, RecordOp, SessionStore, Store


class SessionManager:
    """The host's sessions: ``create``, ``resume``, ``decide``, ``close``, ``forget``,
    ``list``, ``get``, ``shutdown``, and the agent verbs (``send``, ``abort``, ``status``,
    ``messages``, ``log``, ``listen``). Every verb is a coroutine of the manager's event loop.

    Args:
        store: a :class:`~durable_harness.storage.base.Store` or a store spec.
        options: :class:`HostOptions`.

    Errors: every refusal is a :class:`~durable_harness.errors.DurableHarnessError` with its
    ``code`` (``session_not_found``, ``session_live``, ``session_not_live``,
    ``illegal_transition``, ``invalid_request``, ``message_too_large``, ``run_in_progress``,
    ``no_open_run``, ``recovery_error``...); nothing is changed when one is raised.
    """

    def __init__(self, store: Store | str | None = None, options: HostOptions | None = None):
        self.store = store if isinstance(store, Store) else open_store(store)
        self.options = options or HostOptions()
        self._procs: dict[str, SessionProcess] = {}
        self._plans: dict[str, RecoveryPlan] = {}
        self._seen: dict[str, tuple[tuple[int, int, bool], SessionRecord]] = {}  # see _read
        # closed sessions (as last read) with a run still open: only these can have a live
        # recorded tool group (see _live_groups), so only these are probed for one
        self._closed_open: set[str] = set()
        self._keys: dict[str, str] = {}  # creation Idempotency-Key -> session id
        self._observers: list[Callable[[str, Event], None]] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()  # lifecycle moves of different sessions never interleave
        self.unreadable: list[dict[str, Any]] = []
        self.worker: worker.Worker | None = None  # the claim loop, on stores that claim

    # -- the manager's own lifetime ---------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self.reconcile()
            interval = self.options.claim_interval
            if interval is not None and worker.can_claim(self.store):
                self.worker = worker.Worker(self, interval)
                await self._tg.start(self.worker.run)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()
        tg, self._tg = self._tg, None
        if tg is not None:
            await tg.__aexit__(None, None, None)

    def stop_fenced(self) -> list[str]:
        """Stop every generation whose writer lease another writer took (it was paused or
        cut off past its lease: ``host/worker.py``), writing nothing; returns their ids."""
        fenced = [p for p in self._procs.values() if worker.fenced_out(p.session.store)]
        for proc in fenced:
            worker.log.warning(
                "session %s: the lease was taken over by another writer; stopped here",
                proc.record.id,
            )
            proc.scope.cancel()
        return [p.record.id for p in fenced]

    def observe(self, callback: Callable[[str, Event], None]) -> None:
        """Call ``callback(session_id, event)`` for every event of every generation started
        from now on (harness events, plus ``lifecycle`` events ``{"type": "lifecycle",
        "state"}``). Used by metrics and tracing."""
        self._observers.append(callback)

    async def shutdown(self) -> None:
        """Stop every live generation without closing its session: runs are left open as a
        crash would leave them, leases are released (on a worker, handed back instead, so
        the other workers claim them: ``host/worker.py``), and the next start-up reconciles
        them. Idempotent."""
        if self.worker is not None:
            self.worker.stop()
        procs = list(self._procs.values())
        for proc in procs:
            proc.scope.cancel()
        for proc in procs:
            await proc.stopped.wait()

    async def reconcile(self) -> list[SessionRecord]:
        """Start-up reconciliation: read every session of the store; a stored live state
        whose owner is gone becomes ``suspended`` with its recovery plan (``closing``
        becomes ``closed``, after the process groups its unsettled tool calls left running
        are killed under its lease: :meth:`_close_stored`); then, per
        ``options.auto_resume``, resume each suspended session whose plan needs no decision.
        Returns the records after it."""
        self.unreadable = []
        records: list[SessionRecord] = []
        for info in self.store.list_sessions():
            if info.error:
                self.unreadable.append({"id": info.id, "path": info.path, "error": info.error})
                continue
            if info.id in self._procs:
                records.append(self._procs[info.id].record)
                continue
            try:
                rec = await self._read(info.id)
                if rec.state == "closed" and self._live_groups(info.id):
                    # a close a crash interrupted (stored ``closing``): finish it, groups first
                    rec = await self._close_stored(info.id)
                records.append(rec)
            except (SessionLive, LeaseHeld):
                records.append(await self._read(info.id))  # another host took it meanwhile
            except DurableHarnessError as exc:
                self.unreadable.append({"id": info.id, "path": info.path, "error": exc.to_json()})
        if self.options.auto_resume == "no_decision":
            for rec in records:
                plan = self._plans.get(rec.id)
                if rec.state == "suspended" and plan is not None and not needs_decision(plan):
                    try:
                        await self.resume(rec.id)
                    except (SessionLive, LeaseHeld):
                        continue  # another host took it meanwhile
        return [self._procs[r.id].record if r.id in self._procs else r for r in records]

    # -- reading ----------------------------------------------------------------------------

    def _check_id(self, session_id: str) -> str:
        if not SESSION_ID.fullmatch(session_id):
            raise InvalidRequest(
                f"{session_id[:200]!r} is not a session id (letters, digits, '.', '_' and '-')",
                session_id=session_id[:200],
            )
        return session_id

    def _open_read(self, session_id: str) -> SessionStore:
        self._check_id(session_id)
        # One lookup: open_session resolves the reference itself (by the store's exact-id
        # fast path, Store.find_exact), so a second resolve here would only repeat it.
        store = self.store.open_session(session_id, write=False)
        if store.session_id != session_id:  # a unique prefix of another id: ids here are exact
            store.close()
            raise SessionNotFound(f"no session {session_id} in {self.store.spec}", ref=session_id)
        return store

    async def _read(self, session_id: str) -> SessionRecord:
        """The record of a session this process does not run, and its plan when suspended.

        Both are kept, keyed by what any change to the session changes (its last seq, its
        lease generation, whether a live process holds it): a session nobody changed since it
        was last read is not read and planned again. A plan that asked a tool's reconcile hook
        (which looks at the world, not the log) is never kept (``design/host.md``, "Reading
        a session")."""
        with self._open_read(session_id) as store:
            alive = store.lease_holder() is not None
            key = (store.last_seq(), store.generation, alive)
            seen = self._seen.get(session_id)
            if (
                seen is not None
                and seen[0] == key
                and (seen[1].state != "suspended" or session_id in self._plans)
            ):
                return copy_record(seen[1])
            rec, plan = await read_listed(
                store, self.store.spec, self.options.tools, self.options.policy
            )
            if rec.state == "closed" and any(ln.run_id for ln in store.lanes().values()):
                self._closed_open.add(rec.id)
            else:
                self._closed_open.discard(rec.id)
            if rec.client_key:
                self._keys.setdefault(rec.client_key, rec.id)
            keep = True
            if plan is not None:
                self._plans[rec.id] = plan
                tools = self.options.tools(rec.command_runtime)
                keep = not asks_hooks(plan, tools) and not sees_live_group(plan)
            else:
                self._plans.pop(rec.id, None)
            if keep:
                self._seen[rec.id] = (key, copy_record(rec))
            else:
                self._seen.pop(rec.id, None)
        # no plan is offered while a dead generation's group runs here: kill, record, replan
        if (
            rec.state == "suspended"
            and plan_sees_live_group(self._plans[rec.id])
            and kill_stored_leftovers(self.store, session_id, rec.mode)
        ):
            return await self._read(session_id)
        return rec

    async def _read_not_live(self, session_id: str, before: str) -> SessionRecord:
        """The stored record of a session that no live generation holds, here or in another
        process (``before``: what the caller is about to do, for the message).

        Raises:
            SessionLive: a generation of this process runs it, or another live process holds
                it (its record says ``creating``, ``idle`` or ``running`` and its owner lives).
        """
        proc = self._procs.get(self._check_id(session_id))
        if proc is not None:
            raise SessionLive(
                f"session {session_id} is live here (generation {proc.generation}); close it "
                f"before {before}",
                session_id=session_id,
            )
        rec = await self._read(session_id)
        if rec.state in LIVE or rec.state == "creating":
            raise SessionLive(
                f"session {session_id} is held by another live process; close it there before "
                f"{before}",
                session_id=session_id,
            )
        return rec

    async def get(self, session_id: str) -> SessionRecord:
        """The session's record (live ones from memory, others read from the store).

        Raises:
            InvalidRequest: a malformed id. SessionNotFound: no such session.
        """
        proc = self._procs.get(self._check_id(session_id))
        return proc.record if proc is not None else await self._read(session_id)

    async def list(self, states: builtins.list[str] | None = None) -> builtins.list[SessionRecord]:
        """Every readable session of the store, most recently modified first (unreadable
        ones are in :attr:`unreadable`); with ``states``, only those in one of them.

        Raises:
            InvalidRequest: a value of ``states`` is no lifecycle state
                (:func:`~durable_harness.host.listing.check_states`).
        """
        chosen = check_states(states)
        out: list[SessionRecord] = []
        for info in self.store.list_sessions():
            if info.error:
                continue
            try:
                rec = await self.get(info.id)
            except DurableHarnessError:
                continue
            if chosen is None or rec.state in chosen:
                out.append(rec)
        return out

    def waiting(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The in-doubt calls a suspended session waits on for a decision (as last read),
        each with its tool, call id and arguments or their digest
        (:func:`~durable_harness.host.listing.waiting_calls`); ``[]`` otherwise."""
        return waiting_calls(self.plan(session_id))

    def plan(self, session_id: str) -> RecoveryPlan | None:
        """The recovery plan of a suspended session (as last read), else ``None``."""
        proc = self._procs.get(session_id)
        return None if proc is not None else self._plans.get(session_id)

    def awaiting_decisions(self) -> dict[str, int]:
        """``{session id: in-doubt calls waiting for a decision}`` of suspended sessions."""
        return {
            sid: sum(len(lp.waiting()) for lp in plan.lanes)
            for sid, plan in self._plans.items()
            if sid not in self._procs
        }

    # -- lifecycle --------------------------------------------------------------------------

    def _move(self, proc: SessionProcess, state: State) -> None:
        rec = proc.record
        if rec.state == state:
            return
        rec.state = lifecycle.check(rec.id, rec.state, state)
        proc.publish({"type": "lifecycle", "state": state})

    def _write(self, proc: SessionProcess, state: State, **extra: Any) -> None:
        """Make ``state`` durable (a ``session_lifecycle`` record) and enter it."""
        proc.session.store.commit([RecordOp(lifecycle_record(proc.record, state, **extra))])
        self._move(proc, state)

    async def create(
        self,
        cwd: str,
        *,
        mode: str | None = None,
        command_runtime: str = "pipe",
        provider: str | None = None,
        client_key: str | None = None,
    ) -> SessionRecord:
        """Create a session in ``cwd`` and start its generation 1.

        Idempotent by ``client_key``: a second create with the same key returns the first
        one's record.

        Raises:
            InvalidRequest: ``cwd`` is not an existing directory, an unknown ``mode`` or
                ``command_runtime``, an empty ``client_key``, or no provider (none given,
                no host default).
            CwdNotAllowed: ``cwd`` is outside ``options.roots``.
            FormatError, MissingCredential: the provider spec cannot be built.
        """
        for name, value in (("cwd", cwd), ("provider", provider), ("mode", mode)):
            check_text(name, value)
        check_key(client_key)
        if client_key is not None and client_key in self._keys:
            return await self._created_before(
                client_key, cwd, mode=mode, command_runtime=command_runtime, provider=provider
            )
        path = check_root(working_directory(cwd), self.options.roots)
        durability = cast(Durability, mode or self.options.mode)
        if durability not in DURABILITY_MODES:
            raise InvalidRequest(
                f"mode {mode!r} is not a durability mode ({', '.join(DURABILITY_MODES)})"
            )
        if command_runtime not in COMMAND_RUNTIMES:
            raise InvalidRequest(f"command runtime {command_runtime!r} is not pipe or pty")
        spec = provider or self.options.provider
        if spec is None:
            raise InvalidRequest("no provider: give one, or start the host with --provider")
        make_provider(spec)  # a bad spec or a missing credential is refused before any write
        require_credentials(spec)
        store = self.store.create_session(str(path.resolve()), durability=durability)
        rec = SessionRecord(
            id=store.session_id,
            cwd=str(store.header.get("cwd")),
            mode=durability,
            store=self.store.spec,
            transcript=store.location,
            generation=store.generation,
            state="creating",
            command_runtime=command_runtime,  # type: ignore[arg-type]
            provider=spec,
            client_key=client_key,
        )
        if client_key is not None:
            self._keys[client_key] = rec.id
        await self._start(rec, Session(store), None, client_key)
        return rec

    async def _created_before(
        self,
        client_key: str,
        cwd: str,
        *,
        mode: str | None,
        command_runtime: str,
        provider: str | None,
    ) -> SessionRecord:
        """The session a create with ``client_key`` made before, when this request asks for
        the same session (same working directory, mode, command runtime and provider, the
        host's defaults filling what is not given).

        Raises:
            IdempotencyKeyReused: the key came with a different request (``design/http.md``,
                "Idempotency").
        """
        rec = await self.get(self._keys[client_key])
        asked = {
            "cwd": cwd,
            "mode": mode or self.options.mode,
            "command_runtime": command_runtime,
            "provider": provider or self.options.provider,
        }
        try:
            resolved = str(Path(cwd).expanduser().resolve())
        except (OSError, RuntimeError, ValueError):
            resolved = cwd
        had = {
            "cwd": rec.cwd,
            "mode": rec.mode,
            "command_runtime": rec.command_runtime,
            "provider": rec.provider,
        }
        differ = [k for k in asked if (resolved if k == "cwd" else asked[k]) != had[k]]
        if differ:
            raise IdempotencyKeyReused(
                f"Idempotency-Key {client_key[:200]!r} created session {rec.id} with another "
                f"{', '.join(differ)}; use a new key for a different request",
                key=client_key[:200],
                session_id=rec.id,
                fields=differ,
            )
        return rec

    async def resume(
        self, session_id: str, decisions: Mapping[str, Mapping[str, Any]] | None = None
    ) -> SessionRecord:
        """Start the next runtime generation of a closed, suspended or failed session, and
        have it execute the session's recovery plan (``design/recovery.md``).

        ``decisions``: ``{tool call id or call key: {"decision": "retry"|"fail"|"result",
        "result": text}}``. Each is written durably; when the plan still needs a decision,
        the session stays ``suspended`` (no generation is started) and its plan says which.

        Raises:
            SessionLive: a live generation holds the session (here or in another process).
            IllegalTransition: the session is closing.
            AlreadyDecided: a decision names a call attempt decided already.
            RecoveryError: a decision names no call in doubt.
        """
        async with self._lock:
            rec = await self._read_not_live(session_id, "resuming it")
            lifecycle.check(rec.id, rec.state, "creating")
            if decisions:
                self._check_decisions(session_id, rec, decisions)
            try:
                store = self.store.open_session(session_id, write=True, durability=rec.mode)
            except LeaseHeld as exc:
                raise SessionLive(exc.message, session_id=session_id) from exc
            return await self._resume_held(rec, store, decisions)

    async def adopt(self, store: SessionStore) -> SessionRecord:
        """Recover a session whose writer lease this process already holds, taken over from
        a dead writer by the worker loop (``host/worker.py``): exactly what start-up
        reconciliation does for it (the same planner as :meth:`resume`), so it resumes when
        its plan needs no decision and ``options.auto_resume`` allows, else stays
        ``suspended`` with its plan and the lease released. Takes ``store`` over (started,
        closed, or handed back on failure). Returns the record."""
        async with self._lock:
            sid = store.session_id
            old = self._procs.get(sid)
            if old is not None:  # a generation of ours the claim fenced out (it was paused)
                old.scope.cancel()
                await old.stopped.wait()
            try:
                rec = read_record(store, self.store.spec, owner_alive=False)
                store.durability = rec.mode
                if rec.client_key:
                    self._keys.setdefault(rec.client_key, rec.id)
            except BaseException as exc:
                await worker.let_go(store, lost=worker.writer_lost(exc, store))
                raise
            if rec.state != "suspended":  # a crash after `closed`, before the release
                store.close()
                return await self._read(sid)
            try:  # the dead worker's groups on this machine die before the plan
                kill_and_record(store, "claim")
            except BaseException:
                await worker.let_go(store)
                raise
            start = self.options.auto_resume == "no_decision"
            return await self._resume_held(rec, store, None, start=start)

    async def _resume_held(
        self,
        rec: SessionRecord,
        store: SessionStore,
        decisions: Mapping[str, Mapping[str, Any]] | None,
        *,
        start: bool = True,
    ) -> SessionRecord:
        """Plan ``rec``'s session on ``store`` (open for writing, lease held) and start its
        next generation, unless the plan needs a decision (or not ``start``): then the
        decisions are recorded, the lease released, and the session stays suspended."""
        session = Session(store)
        try:
            recovery = await plan_recovery(
                store,
                self.options.tools(rec.command_runtime),
                self.options.policy,
                decisions,
                rec.cwd or None,
            )
        except BaseException as exc:
            await worker.let_go(store, lost=worker.writer_lost(exc, store))
            raise
        if not start or needs_decision(recovery.plan):
            commit_decisions(store, recovery.plan, recovery.decisions)
            session.close()
            return await self._read(rec.id)
        rec.generation = store.generation
        rec.state = "creating"
        rec.last_error = None
        await self._start(rec, session, recovery, None)
        return rec

    def _check_decisions(
        self, session_id: str, rec: SessionRecord, decisions: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Refuse decisions that name no call in doubt before the lease is taken, so a mistyped
        id changes nothing (the rule: :func:`~durable_harness.recovery.decide.resolve_decisions`,
        on a read-only snapshot; the plan applies it again under the lease).

        Raises:
            RecoveryError: as ``resolve_decisions``.
        """
        with self._open_read(session_id) as store:
            tools = declarations(self.options.tools(rec.command_runtime))
            resolve_decisions(take_snapshot(store), decisions, tools)

    async def decide(self, session_id: str, tool_call_id: str, decision: str) -> SessionRecord:
        """Decide one in-doubt call of a suspended session (``retry``, ``fail`` or
        ``result:TEXT``) and resume it when no other call still waits.

        Raises:
            InvalidRequest: a malformed decision.
            AlreadyDecided: the call's current attempt was decided already (also while the
                session is live again, its run still open).
            RecoveryError: no call in doubt has this id (the rule: ``resolve_decisions``).
            SessionLive: the session is live.
        """
        if decision.startswith("result:") and not decision[len("result:") :].strip():
            raise InvalidRequest(
                "the decision result:TEXT needs a non-empty TEXT (it becomes the call's result)",
                decision=decision,
            )
        try:
            key, value = parse_decision(f"{tool_call_id}={decision}")
        except DurableHarnessError as exc:
            raise InvalidRequest(exc.message, decision=decision[:200]) from exc
        if self._check_id(session_id) in self._procs:
            with self._open_read(session_id) as store:  # a decided call says so, even here
                refuse_decided(take_snapshot(store), key, value)
            raise SessionLive(
                f"session {session_id} is live here (generation "
                f"{self._procs[session_id].generation}): only a suspended session waits for "
                "a decision",
                session_id=session_id,
            )
        return await self.resume(session_id, {key: value})

    async def _start(
        self,
        rec: SessionRecord,
        session: Session,
        recovery: Recovery | None,
        client_key: str | None,
    ) -> None:
        """Start a generation for ``rec`` on ``session`` (open for writing) in the manager's
        task group; returns once it is up (or has failed and recorded why)."""
        if self._tg is None:
            session.close()
            raise RuntimeError("use the manager as `async with SessionManager(...)`")
        proc = SessionProcess(rec, session)
        for observer in self._observers:
            proc.observe(partial(observer, rec.id))
        self._procs[rec.id] = proc
        self._plans.pop(rec.id, None)
        await self._tg.start(self._generation, proc, recovery, client_key)

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
                    self._write(proc, "idle", client_key=client_key)
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
                    self._write(proc, "error", error=rec.last_error)
                except Exception:
                    rec.state = "error"  # the store itself failed: the record says so here
        finally:
            with anyio.CancelScope(shield=True):
                await self._release(proc, lost)
                if not started:
                    task_status.started()

    async def _release(self, proc: SessionProcess, lost: bool = False) -> None:
        """End a generation: write ``closed`` if it was closing, let go of the store, forget
        the process. Once only: a close that could not wait for a stuck tool calls it before
        the generation task itself gets there (``host/closing.py``)."""
        if proc.releasing:
            return
        proc.releasing = True
        rec = proc.record
        lost = lost or worker.fenced_out(proc.session.store)
        if rec.state == "closing" and not lost:
            try:
                self._write(proc, "closed")
            except Exception as exc:
                rec.last_error = str(root_cause(exc))
                rec.state = "closed"
        elif lost and rec.state in LIVE:
            self._move(proc, "suspended")  # no record: the new owner's is the truth
        if lost and self.worker is not None:
            self.worker.lost += 1
        hand_over = self.worker is not None and self.worker.stopping
        await worker.let_go(proc.session.store, lost=lost, hand_over=hand_over)
        proc.harness = None
        if self._procs.get(rec.id) is proc:
            self._procs.pop(rec.id, None)
        proc.end_listeners()
        proc.stopped.set()

    @asynccontextmanager
    async def _control(self, proc: SessionProcess) -> AsyncIterator[None]:
        """The generation's control endpoint (``options.control``), if any: its port is
        runtime state on ``proc.port`` while the generation lives, never persisted."""
        factory = self.options.control
        if factory is None:
            yield
            return
        async with factory(self, proc.record.id) as port:
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
            self._move(proc, "running" if proc.running else "idle")

    async def close(self, session_id: str) -> SessionRecord:
        """Close a session in stages (:func:`~durable_harness.host.closing.staged_close`):
        abort its running turns (cooperatively), give them ``options.close_grace`` seconds,
        then the kill step (tool groups SIGKILLed, nothing more recorded), then release the
        lease. Returns within about ``close_grace + 2`` seconds whatever a tool does. The
        record and transcript are kept. Idempotent.

        Raises:
            SessionLive: another process holds the session.
        """
        proc = self._procs.get(self._check_id(session_id))
        if proc is None:
            return await self._close_stored(session_id)
        if proc.record.state != "closing":
            self._write(proc, "closing")
            await staged_close(proc, self.options.close_grace, self._kill_tool_groups)
            with anyio.CancelScope(shield=True):
                await self._release(proc)  # a no-op if the generation got there first
        await proc.stopped.wait()
        return proc.record

    async def allow_tool(self, session_id: str, tool_name: str) -> SessionRecord:
        """Remember durably that ``tool_name`` may run in the session without asking (a
        ``tool_permission`` record); idempotent. Returns the record (``allowed_tools``).

        Raises:
            SessionNotLive: the session has no live generation here.
        """
        proc = self._live(session_id)
        if tool_name not in proc.record.allowed_tools:
            proc.session.store.commit([RecordOp(permission_record(tool_name))])
            proc.record.allowed_tools = sorted({*proc.record.allowed_tools, tool_name})
        return proc.record

    async def kill_tool(self, session_id: str, tool_call_id: str) -> dict[str, Any]:
        """The operator's kill of one unsettled call's live process group, deciding nothing
        (:func:`~durable_harness.host.leftovers.kill_call_group`; a ``tool_process_killed``
        record). Returns ``{"tool_call_id", "pgid", "killed"}``.

        Raises:
            InvalidRequest: no such unsettled call, or no group of it on this machine.
            SessionLive: another live process holds the session. SessionNotFound.
        """
        proc = self._procs.get(self._check_id(session_id))
        if proc is not None:
            return kill_call_group(proc.session.store, tool_call_id)
        async with self._lock:
            rec = await self._read_not_live(session_id, "killing its tool's group")
            with open_for_kill(self.store, session_id, rec.mode) as store:
                out = kill_call_group(store, tool_call_id)
            await self._read(session_id)
            return out

    def _kill_tool_groups(self, proc: SessionProcess) -> None:
        """SIGKILL the live process groups of this generation's unsettled tool calls and wait
        until they are gone (:func:`~durable_harness.harness.groups.kill_groups`)."""
        kill_groups(open_calls(proc.session.store), proc.record.id)

    def _live_groups(self, session_id: str) -> builtins.list[int]:
        """The pgids of the live process groups recorded for the unsettled tool calls of a
        closed session (as last read by :meth:`_read`), read without the writer lease
        (reporting only, never killing). A closed session with no open run has none, and is
        not opened again."""
        if session_id not in self._closed_open:
            return []
        with self._open_read(session_id) as store:
            calls = live_groups(open_calls(store))
        return [(c.process or {}).get("pgid", 0) for c in calls]

    async def _close_stored(self, session_id: str) -> SessionRecord:
        """Close a session no generation of this process runs: under its lease, kill the live
        process groups its crashed generation left for unsettled tool calls, then write
        ``closed`` (a suspended or failed session, or one whose close a crash interrupted:
        stored ``closing``, read as ``closed``). A closed session with no live group is left
        as it is."""
        async with self._lock:
            rec = await self._read_not_live(session_id, "closing it")
            if rec.state == "closed" and not self._live_groups(session_id):
                return rec
            lifecycle.check(rec.id, rec.state, "closed")
            try:
                store = self.store.open_session(session_id, write=True, durability=rec.mode)
            except LeaseHeld as exc:
                raise SessionLive(exc.message, session_id=session_id) from exc
            with store:
                # the lease proves the generation that started them dead: nothing else will
                kill_groups(open_calls(store), session_id)
                rec.generation = store.generation
                store.commit([RecordOp(lifecycle_record(rec, "closed"))])
            return await self._read(session_id)

    async def forget(self, session_id: str) -> None:
        """Delete a closed session (its record and transcript) for good.

        Raises:
            SessionLive: the session is live (here or elsewhere): close it first.
            IllegalTransition: the session is not closed (suspended or failed: close it).
            ToolProcessRunning: closed, but a process group recorded for one of its unsettled
                tool calls still runs (a close a crash interrupted, seen by a host started
                before it): close it again, which kills the group.
        """
        async with self._lock:
            rec = await self._read_not_live(session_id, "forgetting it")
            if rec.state != "closed":
                raise IllegalTransition(
                    f"session {session_id} is {rec.state}: only a closed session can be "
                    "forgotten; close it first",
                    session_id=session_id,
                    **{"from": rec.state, "to": "forgotten"},
                )
            pgids = self._live_groups(session_id)
            if pgids:
                raise ToolProcessRunning(
                    f"session {session_id} is closed but the process groups {pgids} of its "
                    "unsettled tool calls still run; close it again (which kills them) before "
                    "forgetting it",
                    session_id=session_id,
                    pgids=pgids,
                )
            try:
                self.store.delete_session(session_id)
            except LeaseHeld as exc:
                raise SessionLive(exc.message, session_id=session_id) from exc
            self._plans.pop(session_id, None)
            self._seen.pop(session_id, None)
            self._closed_open.discard(session_id)
            if rec.client_key:
                self._keys.pop(rec.client_key, None)

    # -- the agent verbs --------------------------------------------------------------------

    def _live(self, session_id: str) -> SessionProcess:
        """The live generation of ``session_id`` in this process.

        Raises:
            SessionLive: another live process holds the session (``design/host.md``: every
                verb on a session another host holds is ``session_live``).
            SessionNotLive: no live generation anywhere (or the session exists nowhere).
        """
        proc = self._procs.get(self._check_id(session_id))
        if proc is None:
            holder = self._holder_elsewhere(session_id)
            if holder is not None:
                raise SessionLive(
                    f"session {session_id} is live in another process (pid "
                    f"{holder.get('pid')} on {holder.get('host')}); use that host, or close "
                    "it there first",
                    session_id=session_id,
                    holder_pid=holder.get("pid"),
                )
        if proc is None or proc.harness is None or proc.record.state not in LIVE:
            raise SessionNotLive(
                f"session {session_id} has no live generation here; resume it first",
                session_id=session_id,
            )
        return proc

    def _holder_elsewhere(self, session_id: str) -> dict[str, Any] | None:
        """The live process holding the writer lease of a session this process does not run
        (``{"pid", "host", "generation"}``), or ``None`` (also for a session that exists
        nowhere or cannot be read: the caller's own error says so)."""
        try:
            with self._open_read(session_id) as store:
                return store.lease_holder()
        except DurableHarnessError:
            return None

    def check_message(self, message: str) -> None:
        """Refuse an empty message, one with a lone surrogate, or one over
        ``options.max_message_bytes``.

        Raises:
            InvalidRequest, MessageTooLarge.
        """
        if not message.strip():
            raise InvalidRequest("the message is empty")
        check_unicode("message", message)
        size = len(message.encode("utf-8", "surrogatepass"))
        if size > self.options.max_message_bytes:
            raise MessageTooLarge(
                f"the message is {size} bytes; the limit is {self.options.max_message_bytes}",
                size=size,
                limit=self.options.max_message_bytes,
            )

    async def send(
        self,
        session_id: str,
        message: str,
        *,
        mode: SendMode = "prompt",
        lane: str = "main",
        client_key: str | None = None,
    ) -> dict[str, Any]:
        """Send a message: ``prompt`` starts a run, ``steer``/``follow_up`` queue into the
        running one. Returns once the input is durable: ``{"mode", "lane", "run_id"}`` or
        ``{"mode", "lane", "item_id"}``, plus ``"duplicate": true`` when ``client_key``
        was accepted before (nothing is sent twice).

        Raises:
            SessionLive (another process holds it), SessionNotLive, InvalidRequest (a bad
            lane name), MessageTooLarge, IdempotencyKeyReused, RunInProgress (a prompt while a
            run is open on the lane), NoOpenRun (a steer with no run), LaneSuspended.
        """
        self.check_message(message)
        check_key(client_key)
        check_lane(lane)
        if mode not in ("prompt", "steer", "follow_up"):
            raise InvalidRequest(f"mode {mode!r} is not prompt, steer or follow_up")
        proc = self._live(session_id)
        harness = proc.harness
        assert harness is not None
        if client_key is not None:
            prior = harness.accepted(client_key, lane)
            if prior is not None:
                check_same_send(prior, client_key, message, mode)
                return acceptance(prior, lane, duplicate=True)
        if mode == "prompt":
            if proc.accepting or lane in proc.running:
                raise RunInProgress(
                    f"lane {lane!r} of session {session_id} is running a turn; steer it, "
                    "or wait for it to finish",
                    lane=lane,
                )
            proc.accepting = True
            try:
                handle = await harness.prompt(message, lane=lane, client_key=client_key)
            finally:
                proc.accepting = False
            if handle.run_id not in proc.ended:  # it may have finished while being accepted
                proc.running.add(lane)
                self._move(proc, "running")
            return {"mode": mode, "lane": lane, "run_id": handle.run_id}
        verb = harness.steer if mode == "steer" else harness.follow_up
        item_id = await verb(message, lane=lane, client_key=client_key)
        return {"mode": mode, "lane": lane, "item_id": item_id}

    async def abort(self, session_id: str, lane: str = "main") -> dict[str, Any]:
        """Abort the lane's running run (``abort_requested`` durable first); returns
        ``{"lane", "returned"}``: the steer and follow-up messages handed back.

        Raises:
            SessionLive (another process holds it), SessionNotLive, NoOpenRun,
            InvalidRequest (a bad lane name).
        """
        check_lane(lane)
        proc = self._live(session_id)
        assert proc.harness is not None
        returned = await proc.harness.abort(lane=lane)
        return {"lane": lane, "returned": returned}

    async def status(self, session_id: str) -> dict[str, Any]:
        """``{"id", "state", "generation", "lanes", "plan", "port"}``: ``lanes`` lists each
        lane's ``lane``, ``leaf``, ``run_id`` and ``live``; ``plan`` is the recovery plan
        (``durable-harness recover --json``) when suspended, else ``None``."""
        proc = self._procs.get(self._check_id(session_id))
        if proc is not None:
            return status_view(proc.record, proc.session.store, proc.running, None, proc.port)
        rec = await self._read(session_id)
        with self._open_read(session_id) as store:
            plan = self._plans.get(session_id) if rec.state == "suspended" else None
            return status_view(rec, store, set(), plan, None)

    def _reader(self, session_id: str) -> tuple[SessionStore, bool]:
        proc = self._procs.get(self._check_id(session_id))
        if proc is not None:
            return proc.session.store, False
        return self._open_read(session_id), True

    def messages(
        self, session_id: str, *, lane: str = "main", offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """A page of the lane's transcript (:func:`~durable_harness.host.views.transcript_page`)."""
        store, owned = self._reader(session_id)
        try:
            return transcript_page(store, lane, offset, limit)
        finally:
            if owned:
                store.close()

    def log(
        self, session_id: str, *, lane: str | None = None, since_seq: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """A page of the operation log (:func:`~durable_harness.host.views.log_page`)."""
        store, owned = self._reader(session_id)
        try:
            return log_page(store, lane, since_seq, limit)
        finally:
            if owned:
                store.close()

    def listen(self, session_id: str, after: tuple[int, int] | None = None) -> Any:
        """The live generation's event stream, from now on or after the event ``after``
        (``(generation, eventId)``) a reader saw (see :meth:`SessionProcess.listen`).

        Raises:
            SessionLive (another process holds it), SessionNotLive. InvalidRequest: ``after``
            names an event not sent.
        """
        return self._live(session_id).listen(after)
