"""What recovery reads from storage, read once: the snapshot the decision function plans over.

:func:`take_snapshot` is the only place recovery does I/O before deciding (lanes, each lane's
log, the entries the fold needs, damage, the lease, whether a recorded process group is still
alive). :func:`build_snapshot` folds what was read; the decision
(:func:`durable_harness.recovery.decide.plan`) then reads nothing but the snapshot
(``design/recovery.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durable_harness.harness.groups import elsewhere, recorded_group
from durable_harness.harness.state import LaneLog, RunState, fold_lane, fold_run
from durable_harness.storage.base import LaneState, SessionStore
from durable_harness.tools.processes import group_alive

GetEntry = Callable[[str], dict[str, Any] | None]


@dataclass(frozen=True)
class LaneSnapshot:
    """One lane as stored.

    Attributes:
        lane: the lane's stored state (leaf, open run id and the seq of its ``run_started``).
        run: the open run, folded (``None`` when the lane is idle).
        log: the lane's whole log folded (queues, deferred writes).
        run_records: the open run's records, in seq order.
        last_run: the latest settled run: ``{run_id, outcome, reason, attempts}``.
        findings: states of this lane a single writer cannot produce, as damage items
            (``kind``, ``seq``, ``lane``, ``detail``).
    """

    lane: LaneState
    run: RunState | None
    log: LaneLog
    run_records: tuple[dict[str, Any], ...] = ()
    last_run: dict[str, Any] | None = None
    findings: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """A session as stored, read once.

    Attributes:
        session_id: the session.
        lanes: one :class:`LaneSnapshot` per lane, by lane name order.
        damage: what storage reported on open (``kind`` plus ``line``/``offset``/``seq``).
        lease: the live writer holding the session, if another process holds it.
    """

    session_id: str
    lanes: tuple[LaneSnapshot, ...]
    damage: tuple[dict[str, Any], ...] = ()
    lease: dict[str, Any] | None = None

    def all_damage(self) -> list[dict[str, Any]]:
        """Storage damage followed by every lane's findings: what ``fsck`` and ``recover``
        both report."""
        out = list(self.damage)
        for ls in self.lanes:
            out.extend(ls.findings)
        return out


def build_snapshot(
    session_id: str,
    lanes: list[LaneState],
    records: Mapping[str, list[dict[str, Any]]],
    get_entry: GetEntry,
    *,
    damage: list[dict[str, Any]] | None = None,
    lease: dict[str, Any] | None = None,
    alive: Callable[[int, int | None], bool] | None = None,
) -> Snapshot:
    """Fold what was read into a :class:`Snapshot`: every lane's state, each lane's log in
    seq order (``records``), an entry lookup (for assistant and provisioned result entries),
    the ``damage`` found on open, the live ``lease`` holder (never this process), and
    ``alive(pgid, start_time)`` for recorded process groups (``None``: not probed)."""
    out = []
    for state in sorted(lanes, key=lambda s: s.name):
        recs = records.get(state.name, [])
        run = None
        run_records: list[dict[str, Any]] = []
        if state.run_id is not None and state.run_seq is not None:
            run_records = [
                r for r in recs if r["seq"] >= state.run_seq and r.get("runId") == state.run_id
            ]
            run = fold_run(state.run_id, state.name, run_records, get_entry)
            for call in run.tool_calls:
                group = recorded_group(call)
                if alive is not None and call.process is not None:
                    # another machine's group: whether it lives is unknown here (None)
                    up = None if elsewhere(call) else group is not None and alive(*group)
                    call.process = {**call.process, "alive": up}
        findings = _findings(state.name, recs, run, run_records, get_entry)
        out.append(
            LaneSnapshot(
                state, run, fold_lane(recs), tuple(run_records), _last_run(recs), tuple(findings)
            )
        )
    return Snapshot(session_id, tuple(out), tuple(damage or ()), lease)


def take_snapshot(store: SessionStore) -> Snapshot:
    """Read what recovery needs from ``store`` (any open store, read-only or writable).

    Raises:
        StorageError: the store cannot be read.
    """
    lanes = list(store.lanes().values())
    records = {lane.name: store.records(lane.name) for lane in lanes}
    lease = store.lease_holder()
    if lease is not None and lease.get("self"):
        lease = None
    snapshot = build_snapshot(
        store.session_id, lanes, records, store.get_entry, lease=lease, alive=group_alive
    )
    # read after the fold: a damaged row met while folding (an assistant entry the fold
    # fetched) is in the store's damage by then, so both fsck and recover list it
    return dataclasses.replace(snapshot, damage=tuple(store.damage))


def _last_run(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The lane's latest settled run: ``{run_id, outcome, reason, attempts}`` (attempts per
    counter), so a run parked at the attempt cap still shows its count."""
    last = next((r for r in reversed(records) if r.get("type") == "run_finished"), None)
    if last is None:
        return None
    attempts: dict[str, int] = {}
    for r in records:
        if r.get("type") == "provider_request_started" and r.get("runId") == last.get("runId"):
            key = f"{r.get('purpose', 'turn')} {r.get('turn')}"
            attempts[key] = attempts.get(key, 0) + 1
    return {
        "run_id": last.get("runId"),
        "outcome": last.get("outcome"),
        "reason": last.get("reason"),
        "attempts": attempts,
    }


def _findings(
    lane: str,
    records: list[dict[str, Any]],
    run: RunState | None,
    run_records: list[dict[str, Any]],
    get_entry: GetEntry,
) -> list[dict[str, Any]]:
    """States a single writer cannot produce: records of an unknown run, a tool record naming
    no call of its run (every run of the lane, settled ones too: ``fsck`` and ``recover``
    report the same list), two open runs, a settlement without intent, a provisioned result
    id holding other content."""
    out: list[dict[str, Any]] = []

    def add(kind: str, seq: Any, detail: str) -> None:
        out.append({"kind": kind, "line": None, "seq": seq, "lane": lane, "detail": detail})

    runs: set[str] = set()
    for rec in records:
        rid = rec.get("runId")
        if rec.get("type") == "run_started" and rid is not None:
            runs.add(str(rid))
        elif rid is not None and str(rid) not in runs:
            what = f"{rec.get('type')} names run {rid}, which has no run_started on lane {lane}"
            add("unknown_run", rec.get("seq"), what)
    settled: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        rid = rec.get("runId")
        if rid is not None and str(rid) in runs and (run is None or str(rid) != run.run_id):
            settled.setdefault(str(rid), []).append(rec)
    folded = [fold_run(rid, lane, recs, get_entry) for rid, recs in settled.items()]
    refs = [(ref, r.run_id) for r in ([run] if run else []) + folded for ref in r.unknown_refs]
    for ref, run_id in sorted(refs, key=lambda pair: int(pair[0].get("seq") or 0)):
        call = f"{ref['type']} names tool call {ref['toolCallId']}"
        add("unknown_call", ref["seq"], f"{call}, which run {run_id} does not have")
    if run is None:
        return out
    if sum(r.get("type") == "run_started" for r in run_records) > 1:
        add(
            "two_open_runs",
            run_records[0]["seq"],
            f"lane {lane} has more than one run_started open",
        )
    started: set[str] = set()
    for rec in run_records:
        rtype = rec.get("type")
        ident = str(rec.get("callKey") or rec.get("toolCallId"))
        if rtype == "tool_started":
            started.add(ident)
            rid = rec.get("resultEntryId")
            entry = get_entry(str(rid)) if rid else None
            msg = (entry or {}).get("message") or {}
            if entry is not None and msg.get("toolCallId") != rec.get("toolCallId"):
                add("id_conflict", rec["seq"], f"provisioned result id {rid} holds other content")
        elif rtype == "tool_finished" and rec.get("outcome") == "ok" and ident not in started:
            what = f"tool_finished for {rec.get('toolCallId')} has no tool_started"
            add("settlement_without_intent", rec["seq"], what)
    return out
