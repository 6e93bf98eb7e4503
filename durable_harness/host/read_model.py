"""The host's read model: every value a front shows of a session, computed in one place
(``design/host.md``, "Reading a session"). A live session is read from its generation, any
other from the store, read-only, its record and plan kept until the session changes.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from durable_harness.errors import DurableHarnessError, InvalidRequest, SessionLive, SessionNotFound
from durable_harness.harness.groups import live_groups, open_calls
from durable_harness.harness.report import cost_summary
from durable_harness.harness.state import ToolCallState
from durable_harness.host.changes import Changes
from durable_harness.host.leftovers import kill_stored_leftovers, plan_sees_live_group
from durable_harness.host.lifecycle import LIVE, STATES
from durable_harness.host.listing import check_states, read_listed, waiting_calls
from durable_harness.host.options import HostOptions, needs_decision
from durable_harness.host.process import SessionProcess
from durable_harness.host.record import SessionRecord
from durable_harness.ids import SESSION_ID
from durable_harness.recovery.decide import RecoveryPlan, ToolCallPlan
from durable_harness.recovery.explain import Choice, choices, why_in_doubt
from durable_harness.session.session import Session
from durable_harness.storage.base import SessionStore, Store

if TYPE_CHECKING:
    from durable_harness.host.worker import Worker

Hook = Literal["missing", "unsure", "none"]
"""Why a waiting call's tool could not settle it: not installed, unsure, or no hook."""


def parse_ts(value: Any) -> float | None:
    """Seconds since the epoch of a record ``timestamp`` (ISO 8601), or ``None``."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class SessionView:
    """A session's files: every entry and record, each lane's leaf and path (root to leaf)."""

    entries: list[dict[str, Any]]
    records: list[dict[str, Any]]
    lanes: dict[str, str | None]
    paths: dict[str, list[dict[str, Any]]]
    title: str | None = None

    @property
    def cost(self) -> dict[str, Any]:
        """The session's cost so far: the ``total`` of
        :func:`~durable_harness.harness.report.cost_summary`."""
        return dict(cost_summary(self.records, lambda: self.entries)["total"])

    @property
    def last_activity(self) -> str | None:
        """The latest timestamp of an entry or record (UTC ISO 8601), or ``None``."""
        return last_activity(self.entries, self.records)


def last_activity(
    entries: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]
) -> str | None:
    """The latest ``timestamp`` among ``entries`` and ``records``, or ``None``."""
    best: tuple[float, str] | None = None
    for item in (*entries, *records):
        t = parse_ts(item.get("timestamp"))
        if t is not None and (best is None or t > best[0]):
            best = (t, str(item.get("timestamp")))
    return best[1] if best else None


@dataclass
class WaitingCall:
    """A call a suspended session waits on for a decision, as a page shows it: ``started_at``
    (its latest ``tool_started`` record's timestamp), ``why`` (plain words:
    :func:`~durable_harness.recovery.explain.why_in_doubt`) and ``choices`` (each decision
    with what it will do)."""

    lane: str
    run_id: str | None
    call: ToolCallPlan
    hook: Hook
    idempotency_key: str
    started_at: str | None = None
    why: str = ""
    choices: builtins.list[Choice] = dataclasses.field(default_factory=builtins.list)


@dataclass
class SessionDetail:
    """What a session's page shows (:meth:`ReadModel.detail`); ``running``: ids of unsettled
    calls whose process group is alive here; ``resumable``: :func:`resumable`."""

    record: SessionRecord
    status: dict[str, Any]
    plan: RecoveryPlan | None
    needs_decision: bool
    resumable: bool
    view: SessionView
    running: set[str]
    waiting: list[WaitingCall]


def resumable(rec: SessionRecord, plan: RecoveryPlan | None) -> bool:
    """Whether ``resume`` would start a generation of ``rec``'s session (``plan``: its plan
    when suspended)."""
    if rec.state == "suspended":
        return plan is None or not needs_decision(plan)
    return rec.state in ("closed", "error")


def _copy(rec: SessionRecord) -> SessionRecord:
    """A record the caller may change without changing the kept one."""
    return dataclasses.replace(rec, allowed_tools=[*rec.allowed_tools])


class ReadModel:
    """The read side of the host.

    Attributes:
        live: ``{session id: live generation}`` of this process (the runner keeps it).
        plans: the kept recovery plans of suspended sessions, by id.
        keys: ``{creation Idempotency-Key: session id}``.
        unreadable: ``{"id", "path", "error"}`` of each session the last reconciliation
            could not read.
        worker: the claim loop, on stores that claim; lost: generations stopped because
            their writer lost the session.
        pending: the ids of the sessions whose start-up resume is queued and not begun, in
            queue order (the :class:`~durable_harness.host.reconcile.Reconciler` keeps it).
        changes: bumped when a session's state, or whether it waits for a decision, changes
            as this process sees it (:class:`~durable_harness.host.changes.Changes`).
    """

    def __init__(self, store: Store, options: HostOptions) -> None:
        self.store = store
        self.options = options
        self.live: dict[str, SessionProcess] = {}
        self.plans: dict[str, RecoveryPlan] = {}
        self.keys: dict[str, str] = {}
        self.unreadable: list[dict[str, Any]] = []
        self.worker: Worker | None = None
        self.lost = 0
        self.pending: dict[str, None] = {}
        self.changes = Changes()
        self._shown: dict[str, tuple[str, bool]] = {}  # id -> (state, waits), as last read
        self._titles: dict[str, tuple[int, str | None]] = {}  # id -> (last seq, title)
        self._seen: dict[str, tuple[tuple[int, int, bool], SessionRecord]] = {}  # see read
        # closed sessions (as last read) with a run still open: only these can have a live
        # recorded tool group (see live_groups), so only these are probed for one
        self._closed_open: set[str] = set()

    # -- reading one session from the store ------------------------------------------------

    def check_id(self, session_id: str) -> str:
        """``session_id`` when it looks like one, else :class:`InvalidRequest`."""
        if not SESSION_ID.fullmatch(session_id):
            raise InvalidRequest(
                f"{session_id[:200]!r} is not a session id (letters, digits, '.', '_' and '-')",
                session_id=session_id[:200],
            )
        return session_id

    def open_read(self, session_id: str) -> SessionStore:
        """Open ``session_id`` read-only, by its exact id (``InvalidRequest``: a malformed
        id; ``SessionNotFound``: no such session)."""
        self.check_id(session_id)
        store = self.store.open_session(session_id, write=False)
        if store.session_id != session_id:  # a unique prefix of another id: ids here are exact
            store.close()
            raise SessionNotFound(f"no session {session_id} in {self.store.spec}", ref=session_id)
        return store

    async def read(self, session_id: str) -> SessionRecord:
        """The record of a session this process does not run, and its plan when suspended,
        both kept until the session changes; a dead generation's live group here is killed
        before a plan is offered (``design/host.md``, "Reading a session")."""
        with self.open_read(session_id) as store:
            self._title_of(store)  # kept for the list: it reads every record just before
            key = (store.last_seq(), store.generation, store.lease_holder() is not None)
            seen = self._seen.get(session_id)
            if (
                seen is not None
                and seen[0] == key
                and (seen[1].state != "suspended" or session_id in self.plans)
            ):
                return _copy(seen[1])
            rec, plan = await read_listed(
                store, self.store.spec, self.options.tools, self.options.policy
            )
            if rec.state == "closed" and any(ln.run_id for ln in store.lanes().values()):
                self._closed_open.add(rec.id)
            else:
                self._closed_open.discard(rec.id)
            if rec.client_key:
                self.keys.setdefault(rec.client_key, rec.id)
            keep = True
            if plan is not None:
                self.plans[rec.id] = plan
                tools = self.options.tools(rec.command_runtime)
                asked = any(
                    (tool := tools.get(c.tool_name)) is not None and tool.can_reconcile
                    for c in plan.open_calls()
                )
                keep = not asked and not plan_sees_live_group(plan)
            else:
                self.plans.pop(rec.id, None)
            shown = (rec.state, plan is not None and needs_decision(plan))
            if self._shown.get(rec.id) != shown:
                self._shown[rec.id] = shown
                self.changes.bump(rec.id)
            if keep:
                self._seen[rec.id] = (key, _copy(rec))
            else:
                self._seen.pop(rec.id, None)
        if (
            plan is not None
            and plan_sees_live_group(plan)
            and kill_stored_leftovers(self.store, session_id, rec.mode)
        ):
            return await self.read(session_id)
        return rec

    async def read_not_live(self, session_id: str, before: str) -> SessionRecord:
        """The stored record of a session no live generation holds, here or elsewhere
        (``before``: what the caller is about to do, for the message).

        Raises:
            SessionLive: a generation here runs it, or another live process holds it.
        """
        proc = self.live.get(self.check_id(session_id))
        if proc is not None:
            raise SessionLive(
                f"session {session_id} is live here (generation {proc.generation}); close it "
                f"before {before}",
                session_id=session_id,
            )
        rec = await self.read(session_id)
        if rec.state in LIVE or rec.state == "creating":
            raise SessionLive(
                f"session {session_id} is held by another live process; close it there before "
                f"{before}",
                session_id=session_id,
            )
        return rec

    def live_groups(self, session_id: str) -> builtins.list[int]:
        """The pgids of the live groups recorded for a closed session's unsettled calls (as
        last read; one with no open run is not opened again)."""
        if session_id not in self._closed_open:
            return []
        return [(c.process or {}).get("pgid", 0) for c in self._live_calls(session_id)]

    def _live_calls(self, session_id: str) -> builtins.list[ToolCallState]:
        """The unsettled calls whose recorded process group is alive on this machine now."""
        with self.open_read(session_id) as store:
            return live_groups(open_calls(store))

    def holder_elsewhere(self, session_id: str) -> dict[str, Any] | None:
        """The live process holding the writer lease of a session this process does not run
        (``{"pid", "host", "generation"}``), or ``None`` (also when it cannot be read)."""
        try:
            with self.open_read(session_id) as store:
                return store.lease_holder()
        except DurableHarnessError:
            return None

    def drop(self, session_id: str, client_key: str | None) -> None:
        """Forget what is kept of a deleted session."""
        self.plans.pop(session_id, None)
        self._seen.pop(session_id, None)
        self._shown.pop(session_id, None)
        self._titles.pop(session_id, None)
        self._closed_open.discard(session_id)
        self.changes.bump(session_id)
        if client_key:
            self.keys.pop(client_key, None)

    # -- what the fronts read ---------------------------------------------------------------

    async def get(self, session_id: str) -> SessionRecord:
        """The session's record, live ones from memory (raises as :meth:`open_read`)."""
        proc = self.live.get(self.check_id(session_id))
        return proc.record if proc is not None else await self.read(session_id)

    async def list(self, states: builtins.list[str] | None = None) -> builtins.list[SessionRecord]:
        """Every readable session, most recently modified first; with ``states``, only those
        in one of them.

        Raises:
            InvalidRequest: a value of ``states`` is no lifecycle state.
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

    async def listing(self, states: builtins.list[str] | None = None) -> dict[str, Any]:
        """``GET /sessions``: ``{"sessions", "unreadable", "resumes_pending"}``, each record
        with its ``waiting`` and ``resume_pending`` (:meth:`resume_positions`)."""
        records = await self.list(states)
        queued = self.resume_positions()
        sessions = [
            r.to_json()
            | {
                "title": self.title(r.id),
                "waiting": self.waiting(r.id),
                "resume_pending": queued.get(r.id),
            }
            for r in records
        ]
        return {"sessions": sessions, "unreadable": self.unreadable, "resumes_pending": len(queued)}

    def title(self, session_id: str) -> str | None:
        """What a list shows for the session: :attr:`Session.title` (its name, else its first
        prompt's first line), or ``None`` (also when it cannot be read)."""
        proc = self.live.get(session_id)
        if proc is None and session_id in self._titles:  # kept by the last read
            return self._titles[session_id][1]
        try:
            with self._reader(session_id) as store:
                return self._title_of(store)
        except DurableHarnessError:
            return None

    def _title_of(self, store: SessionStore) -> str | None:
        """``store``'s session title, kept until its last ``seq`` changes."""
        seq = store.last_seq()
        kept = self._titles.get(store.session_id)
        if kept is not None and kept[0] == seq:
            return kept[1]
        title = Session(store).title
        self._titles[store.session_id] = (seq, title)
        return title

    def resume_positions(self) -> dict[str, int]:
        """``{session id: place in the start-up resume queue}`` (1: the next to begin) of
        the sessions whose resume is queued and not begun."""
        return {sid: i for i, sid in enumerate(self.pending, 1)}

    def resume_position(self, session_id: str) -> int | None:
        """The session's place in the start-up resume queue (1: next), or ``None``."""
        if session_id not in self.pending:
            return None
        return next(i for i, sid in enumerate(self.pending, 1) if sid == session_id)

    def plan(self, session_id: str) -> RecoveryPlan | None:
        """The recovery plan of a suspended session (as last read), else ``None``."""
        return None if session_id in self.live else self.plans.get(session_id)

    def waiting(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The in-doubt calls a suspended session waits on (as last read:
        :func:`~durable_harness.host.listing.waiting_calls`)."""
        plan = self.plan(session_id)
        if plan is None or not any(lp.waiting() for lp in plan.lanes):
            return []
        try:
            with self.open_read(session_id) as store:
                started = {
                    str(r.get("callKey")): str(r.get("timestamp"))
                    for r in store.records(None, types=("tool_started",))
                }
        except DurableHarnessError:
            started = {}
        return waiting_calls(plan, started)

    def awaiting_decisions(self) -> dict[str, int]:
        """``{session id: in-doubt calls waiting for a decision}`` of suspended sessions."""
        return {
            sid: sum(len(lp.waiting()) for lp in plan.lanes)
            for sid, plan in self.plans.items()
            if sid not in self.live
        }

    async def state_counts(self) -> dict[str, int]:
        """``{state: sessions}`` over every lifecycle state (0 where none is)."""
        counts = Counter(rec.state for rec in await self.list())
        return {state: counts.get(state, 0) for state in STATES}

    def worker_counts(self) -> tuple[int, int, int] | None:
        """``(sessions claimed, claim rounds failed, generations lost)`` on a worker, else
        ``None``."""
        w = self.worker
        return None if w is None else (len(w.claimed), w.failures, self.lost)

    async def status(self, session_id: str) -> dict[str, Any]:
        """``{"id", "state", "generation", "lanes", "plan", "port", "last_error",
        "resume_pending"}``; ``plan`` only when suspended; ``resume_pending``: its place in
        the start-up resume queue (:meth:`resume_position`), else ``None``."""
        proc = self.live.get(self.check_id(session_id))
        if proc is not None:
            return _status(proc.record, proc.session.store, proc.running, None, proc.port)
        rec = await self.read(session_id)
        with self.open_read(session_id) as store:
            plan = self.plans.get(session_id) if rec.state == "suspended" else None
            out = _status(rec, store, set(), plan, None)
        return out | {"resume_pending": self.resume_position(session_id)}

    def messages(
        self, session_id: str, *, lane: str = "main", offset: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """A page of the lane's transcript (root to leaf):
        ``{"lane", "total", "offset", "limit", "entries"}``."""
        with self._reader(session_id) as store:
            session = Session(store)
            path = session.path(session.leaf(lane))
        page = path[offset : offset + limit]
        return {"lane": lane, "total": len(path), "offset": offset, "limit": limit, "entries": page}

    def log(
        self, session_id: str, *, lane: str | None = None, since_seq: int = 0, limit: int = 100
    ) -> dict[str, Any]:
        """A page of the operation log: ``{"records", "next_since_seq"}`` (records with a
        ``seq`` above ``since_seq``; ``next_since_seq`` is ``None`` on the last page)."""
        with self._reader(session_id) as store:
            records = store.records(lane, since_seq=since_seq)
        page = records[:limit]
        more = len(records) > limit
        return {"records": page, "next_since_seq": page[-1]["seq"] if more and page else None}

    def view(self, session_id: str) -> SessionView:
        """The session's files, read-only, no lease (raises as :meth:`Store.open_session`)."""
        with self.store.open_session(session_id, write=False) as s:
            session = Session(s)
            lanes = {name: lane.leaf_id for name, lane in sorted(s.lanes().items())}
            paths = {name: session.path(leaf) for name, leaf in lanes.items()}
            return SessionView(s.iter_entries(), s.records(None), lanes, paths, session.title)

    async def detail(self, session_id: str) -> SessionDetail:
        """Everything a session's page shows (``InvalidRequest``, ``SessionNotFound``,
        ``StorageError``: the session cannot be read)."""
        rec = await self.get(session_id)
        status = await self.status(session_id)
        plan = self.plan(session_id) if rec.state == "suspended" else None
        view = self.view(session_id)
        running = {call.tool_call_id for call in self._live_calls(session_id)}
        started = [r for r in view.records if r.get("type") == "tool_started"]
        keys = {
            str(r.get("callKey")): str(r["idempotencyKey"])
            for r in started
            if r.get("idempotencyKey")
        }
        started_at = {str(r.get("callKey")): r.get("timestamp") for r in started}
        tools = self.options.tools(rec.command_runtime)
        waiting: builtins.list[WaitingCall] = []
        for lp in plan.lanes if plan is not None else []:
            for call in lp.waiting():
                tool = tools.get(call.tool_name)
                hook: Hook = (
                    "missing" if tool is None else "unsure" if tool.can_reconcile else "none"
                )
                at = started_at.get(call.call_key)
                waiting.append(
                    WaitingCall(
                        lp.lane,
                        lp.run_id,
                        call,
                        hook,
                        keys.get(call.call_key, ""),
                        at,
                        why_in_doubt(call, at),
                        choices(call),
                    )
                )
        decision = plan is not None and needs_decision(plan)
        return SessionDetail(
            rec, status, plan, decision, resumable(rec, plan), view, running, waiting
        )

    @contextmanager
    def _reader(self, session_id: str) -> Iterator[SessionStore]:
        """The live generation's store (left open) or a read-only open (closed after)."""
        proc = self.live.get(self.check_id(session_id))
        if proc is not None:
            yield proc.session.store
            return
        with self.open_read(session_id) as store:
            yield store


def _status(
    rec: SessionRecord,
    store: SessionStore,
    running: set[str],
    plan: RecoveryPlan | None,
    port: int | None,
) -> dict[str, Any]:
    lanes = [
        {"lane": name, "leaf": lane.leaf_id, "run_id": lane.run_id, "live": name in running}
        for name, lane in sorted(store.lanes().items())
    ]
    return {
        "id": rec.id,
        "state": rec.state,
        "generation": rec.generation,
        "lanes": lanes,
        "plan": plan.to_json() if plan is not None else None,
        "port": port,
        "last_error": rec.last_error,
        "resume_pending": None,
    }
