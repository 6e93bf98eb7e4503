"""The session manager: many durable sessions in one process (``design/host.md``, "The
manager"): the read model plus the verbs, each thin over the
:class:`~durable_harness.host.runner.GenerationRunner` (live generations), the
:class:`~durable_harness.host.reconcile.Reconciler` (sessions no generation runs) and the
:class:`~durable_harness.host.worker.Worker` (claims on a shared store).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Self, cast

import anyio
import anyio.abc

from durable_harness.errors import (
    DurableHarnessError,
    IdempotencyKeyReused,
    InvalidRequest,
    MessageTooLarge,
    RunInProgress,
    SessionLive,
    SessionNotLive,
)
from durable_harness.harness.core import Event
from durable_harness.host import worker
from durable_harness.host.forget import forget_refusal, forget_stored
from durable_harness.host.inputs import (
    check_key,
    check_lane,
    check_root,
    check_same_send,
    check_text,
    check_unicode,
    working_directory,
)
from durable_harness.host.leftovers import kill_call_group, open_writable
from durable_harness.host.lifecycle import LIVE
from durable_harness.host.logbook import HostLog
from durable_harness.host.notify import Notifier
from durable_harness.host.options import HostOptions, SendMode
from durable_harness.host.process import SessionProcess
from durable_harness.host.read_model import ReadModel
from durable_harness.host.reconcile import Decisions, Reconciler
from durable_harness.host.record import SessionRecord, permission_record
from durable_harness.host.runner import GenerationRunner
from durable_harness.models.records import COMMAND_RUNTIMES
from durable_harness.providers import make_provider, require_credentials
from durable_harness.recovery.decide import refuse_decided
from durable_harness.recovery.resume import parse_decision
from durable_harness.recovery.snapshot import take_snapshot
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.storage.base import DURABILITY_MODES, Durability, SessionStore, Store


class SessionManager(ReadModel):
    """The host's sessions: the :class:`ReadModel` plus the verbs, used as ``async with
    SessionManager(store, options) as manager:`` (entering it reconciles the store).

    Args:
        store: a :class:`~durable_harness.storage.base.Store` or a store spec.
        options: :class:`HostOptions`.

    Errors: every refusal is a :class:`~durable_harness.errors.DurableHarnessError` with its
    ``code``; nothing is changed when one is raised.
    """

    def __init__(self, store: Store | str | None = None, options: HostOptions | None = None):
        super().__init__(
            store if isinstance(store, Store) else open_store(store), options or HostOptions()
        )
        control = self.options.control
        self.runner = GenerationRunner(self, partial(control, self) if control else None)
        self._lock = anyio.Lock()  # lifecycle moves of different sessions never interleave
        self.reconciler = Reconciler(self, self.runner, self._lock)
        notify = self.options.notify
        self.notifier = Notifier(self, notify) if notify is not None and notify.active() else None
        self.host_log = HostLog()  # lifecycle changes and runs on the durable_harness.host log
        self.observe(self.host_log.observe)
        for observer in self.options.observers:
            self.observe(observer)

    # -- the manager's own lifetime ---------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self.options.mcp is not None:  # its tools are declared before reconciliation
            await self.options.mcp.__aenter__()
        tg = self.runner.tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await self.reconciler.reconcile()
            interval = self.options.claim_interval
            if interval is not None and worker.can_claim(self.store):
                self.worker = worker.Worker(self, interval)
                # its first round too runs after entering: a claimed session is resumed as
                # a queued one is, once the manager serves (design/host.md, "Workers")
                tg.start_soon(self.worker.run)
            if self.notifier is not None:  # notices derived from the store (design/notify.md)
                self.observe(lambda sid, _event: self._touch(sid))
                tg.start_soon(self.notifier.run)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.shutdown()
            tg, self.runner.tg = self.runner.tg, None
            if tg is not None:
                await tg.__aexit__(None, None, None)
        finally:
            if self.options.mcp is not None:
                await self.options.mcp.__aexit__(None, None, None)

    def observe(self, callback: Callable[[str, Event], None]) -> None:
        """Call ``callback(session_id, event)`` for every event of every generation started
        from now on (plus ``{"type": "lifecycle", "state"}`` events)."""
        self.runner.observers.append(callback)

    async def shutdown(self) -> None:
        """Stop the start-up resumes still queued (one in progress finishes first), then every
        live generation without closing its session, as a crash would (on a worker, their
        sessions are handed back). Idempotent."""
        await self.reconciler.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.worker is not None:
            self.worker.stop()
            self.runner.hand_over = True
        await self.runner.stop_all()

    async def wait_resumed(self) -> None:
        """Return once the start-up resumes (run in the background after entering: see
        :meth:`Reconciler.reconcile`) have all begun or been dropped; at once when none was
        queued. Their sessions' places in the queue: :meth:`resume_positions`."""
        await self.reconciler.wait_resumed()

    def _touch(self, session_id: str) -> None:
        """Tell the notifier (if any) that ``session_id``'s facts may have changed."""
        if self.notifier is not None:
            self.notifier.touch(session_id)

    def stop_fenced(self) -> list[str]:
        """Stop every generation whose writer lease another writer took, writing nothing;
        returns their ids (:meth:`GenerationRunner.stop_fenced`)."""
        return self.runner.stop_fenced()

    # -- the verbs --------------------------------------------------------------------------

    async def create(
        self,
        cwd: str,
        *,
        mode: str | None = None,
        command_runtime: str = "pipe",
        provider: str | None = None,
        client_key: str | None = None,
    ) -> SessionRecord:
        """Create a session in ``cwd`` and start its generation 1; a repeated ``client_key``
        returns the first create's record.

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
        if client_key is not None and client_key in self.keys:
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
            self.keys[client_key] = rec.id
        await self.runner.start(rec, Session(store), None, client_key)
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
        """The session a create with ``client_key`` made before, if this one asks the same.

        Raises:
            IdempotencyKeyReused: the key came with a different request.
        """
        rec = await self.get(self.keys[client_key])
        try:
            resolved = str(Path(cwd).expanduser().resolve())
        except (OSError, RuntimeError, ValueError):
            resolved = cwd
        asked = (
            resolved,
            mode or self.options.mode,
            command_runtime,
            provider or self.options.provider,
        )
        had = (rec.cwd, rec.mode, rec.command_runtime, rec.provider)
        fields = ("cwd", "mode", "command_runtime", "provider")
        differ = [name for name, a, h in zip(fields, asked, had, strict=True) if a != h]
        if differ:
            raise IdempotencyKeyReused(
                f"Idempotency-Key {client_key[:200]!r} created session {rec.id} with another "
                f"{', '.join(differ)}; use a new key for a different request",
                key=client_key[:200],
                session_id=rec.id,
                fields=differ,
            )
        return rec

    async def resume(self, session_id: str, decisions: Decisions | None = None) -> SessionRecord:
        """Start the next generation of a closed, suspended or failed session, executing its
        recovery plan with ``decisions`` (:data:`Decisions`, written durably); when the plan
        still needs one, the session stays ``suspended`` with no generation.

        Raises:
            SessionLive: a live generation holds the session (here or in another process).
            IllegalTransition: the session is closing.
            AlreadyDecided: a decision names a call attempt decided already.
            RecoveryError: a decision names no call in doubt.
        """
        try:
            return await self.reconciler.resume(session_id, decisions)
        finally:
            self._touch(session_id)

    async def adopt(self, store: SessionStore) -> SessionRecord:
        """Recover a session the worker loop claimed (lease held): resumed as start-up
        reconciliation would, else left ``suspended``. Takes ``store`` over; returns the
        record."""
        return await self.reconciler.adopt(store)

    async def decide(
        self, session_id: str, tool_call_id: str, decision: str, *, author: str | None = None
    ) -> SessionRecord:
        """Decide one in-doubt call of a suspended session (``retry``, ``fail`` or
        ``result:TEXT``) and resume it when no other call still waits; ``author`` (who
        decided: ``policy:timeout`` for the decision timeout, ``design/notify.md``) is kept
        on the decision record.

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
        if self.check_id(session_id) in self.live:
            with self.open_read(session_id) as store:  # a decided call says so, even here
                refuse_decided(take_snapshot(store), key, value)
            raise SessionLive(
                f"session {session_id} is live here (generation "
                f"{self.live[session_id].generation}): only a suspended session waits for "
                "a decision",
                session_id=session_id,
            )
        if author:
            value["author"] = author
        return await self.resume(session_id, {key: value})

    async def close(self, session_id: str) -> SessionRecord:
        """Close a session in stages (:meth:`GenerationRunner.close`), within about
        ``close_grace + 2`` seconds; record and transcript are kept. Idempotent
        (``SessionLive``: another process holds it)."""
        proc = self.live.get(self.check_id(session_id))
        if proc is None:
            try:
                return await self.reconciler.close_stored(session_id)
            except SessionLive:
                proc = self.live.get(session_id)
                if proc is None:
                    raise
                # its start-up resume began while this close waited: close what it started
        await self.runner.close(proc)
        return proc.record

    async def allow_tool(self, session_id: str, tool_name: str) -> SessionRecord:
        """Record that ``tool_name`` may run in the session without asking; idempotent
        (``SessionNotLive``: no live generation here)."""
        proc = self._held(session_id)
        if tool_name not in proc.record.allowed_tools:
            assert proc.harness is not None  # a live generation has one
            proc.harness.record(permission_record(tool_name))
            proc.record.allowed_tools = sorted({*proc.record.allowed_tools, tool_name})
        return proc.record

    async def kill_tool(self, session_id: str, tool_call_id: str) -> dict[str, Any]:
        """The operator's kill of one unsettled call's live group, deciding nothing
        (:func:`~durable_harness.host.leftovers.kill_call_group`, whose answer it returns).

        Raises:
            InvalidRequest: no such unsettled call, or no group of it on this machine.
            SessionLive: another live process holds the session. SessionNotFound.
        """
        proc = self.live.get(self.check_id(session_id))
        if proc is not None:
            write = proc.harness.record if proc.harness is not None else None
            return kill_call_group(proc.session.store, tool_call_id, write)
        async with self._lock:
            rec = await self.read_not_live(session_id, "killing its tool's group")
            with open_writable(self.store, session_id, rec.mode) as store:
                out = kill_call_group(store, tool_call_id)
            await self.read(session_id)
            return out

    async def forget(self, session_id: str) -> None:
        """Delete a closed session (its record and transcript) for good.

        Raises:
            SessionLive: the session is live (here or elsewhere): close it first.
            IllegalTransition: the session is not closed (suspended or failed: close it).
            ToolProcessRunning: a group recorded for one of its unsettled calls still runs
                (close it again, which kills the group).
        """
        async with self._lock:
            rec = await self.read_not_live(session_id, "forgetting it")
            refusal = forget_refusal(session_id, rec.state, self.live_groups(session_id))
            if refusal is not None:
                raise refusal
            forget_stored(self.store, session_id)
            self.drop(session_id, rec.client_key)
            self.host_log.forget(session_id)

    # -- the agent verbs --------------------------------------------------------------------

    def _held(self, session_id: str) -> SessionProcess:
        """The live generation of ``session_id`` in this process.

        Raises:
            SessionLive: another live process holds the session.
            SessionNotLive: no live generation anywhere (or no such session).
        """
        proc = self.live.get(self.check_id(session_id))
        if proc is None:
            holder = self.holder_elsewhere(session_id)
            if holder is not None:
                raise SessionLive(
                    f"session {session_id} is live in another process (pid "
                    f"{holder.get('pid')} on {holder.get('host')}); use that host, or close "
                    "it there first",
                    session_id=session_id,
                    holder_pid=holder.get("pid"),
                )
        queued = self.resume_position(session_id) if proc is None else None
        if queued is not None:
            raise SessionNotLive(
                f"session {session_id} has no live generation yet: its start-up resume is "
                f"queued (place {queued}); wait for it, or resume it now",
                session_id=session_id,
                resume_pending=queued,
            )
        if proc is None or proc.harness is None or proc.record.state not in LIVE:
            raise SessionNotLive(
                f"session {session_id} has no live generation here; resume it first",
                session_id=session_id,
            )
        return proc

    def check_message(self, message: str) -> None:
        """Refuse an empty message or a lone surrogate (``InvalidRequest``), or one over
        ``max_message_bytes`` (``MessageTooLarge``)."""
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
        running one. Returns once the input is durable: ``{"mode", "lane", "run_id" |
        "item_id"}``, plus ``"duplicate": true`` when ``client_key`` was accepted before.

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
        proc = self._held(session_id)
        harness = proc.harness
        assert harness is not None
        if client_key is not None:
            prior = harness.accepted(client_key, lane)
            if prior is not None:
                check_same_send(prior, client_key, message, mode)
                return _acceptance(prior, lane)
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
                self.runner.move(proc, "running")
            return {"mode": mode, "lane": lane, "run_id": handle.run_id}
        verb = harness.steer if mode == "steer" else harness.follow_up
        item_id = await verb(message, lane=lane, client_key=client_key)
        return {"mode": mode, "lane": lane, "item_id": item_id}

    async def abort(self, session_id: str, lane: str = "main") -> dict[str, Any]:
        """Abort the lane's running run (``abort_requested`` durable first); returns
        ``{"lane", "returned"}``: the steer and follow-up messages handed back.

        Raises:
            SessionLive, SessionNotLive (as :meth:`send`), NoOpenRun, InvalidRequest.
        """
        check_lane(lane)
        proc = self._held(session_id)
        assert proc.harness is not None
        returned = await proc.harness.abort(lane=lane)
        return {"lane": lane, "returned": returned}

    def listen(self, session_id: str, after: tuple[int, int] | None = None) -> Any:
        """The live generation's event stream, from now on or after ``after``
        (``(generation, eventId)``: :meth:`SessionProcess.listen`).

        Raises:
            SessionLive, SessionNotLive; InvalidRequest: ``after`` names an event not sent.
        """
        return self._held(session_id).listen(after)


def _acceptance(rec: dict[str, Any], lane: str) -> dict[str, Any]:
    """What ``send`` returns for an input ``rec`` accepted before."""
    if rec.get("type") == "run_started":
        return {"mode": "prompt", "lane": lane, "run_id": rec.get("runId"), "duplicate": True}
    mode, item = rec.get("queue", "write"), rec.get("itemId")
    return {"mode": mode, "lane": lane, "item_id": item, "duplicate": True}
