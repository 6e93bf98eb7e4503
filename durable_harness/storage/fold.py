"""The one lane/run fold: how committed ops move a session's lanes (an entry op's lane leaf, a run
opened and closed by its records, a lane op's leaf and config; ``design/storage.md``), applied by
every backend (PostgreSQL's ``dh_write`` restates it in SQL)."""

from __future__ import annotations

from typing import Any

from durable_harness.storage.base import EntryOp, LaneState, Op, RecordOp


def number(ops: list[Op], seq: int) -> list[dict[str, Any]]:
    """``ops`` numbered past ``seq``, as the op dicts a JSONL line holds (entries and records
    copied)."""
    out: list[dict[str, Any]] = []
    for op in ops:
        seq += 1
        if isinstance(op, EntryOp):
            d: dict[str, Any] = {"op": "entry", "entry": {**op.entry, "seq": seq}}
            if op.lane is not None:
                d["lane"] = op.lane
        elif isinstance(op, RecordOp):
            d = {"op": "record", "record": {**op.record, "seq": seq}}
        else:
            d = {"op": "lane", "lane": op.lane, "seq": seq}
            if op.sets_leaf():
                d["leafId"] = op.leaf_id
            if op.config:
                d["config"] = op.config
        out.append(d)
    return out


def lane_change(op: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """What the numbered ``op`` does to a lane: ``(lane, change)`` or ``None``; ``change`` holds
    ``leaf_id``, ``config`` (merged), ``run`` (``(run_id, seq)`` opens) or ``close`` (a run id)."""
    kind = op.get("op")
    if kind == "entry":
        lane = op.get("lane")
        return None if lane is None else (str(lane), {"leaf_id": op["entry"]["id"]})
    if kind == "record":
        rec = op["record"]
        lane, rtype, run_id = rec.get("lane"), rec.get("type"), rec.get("runId")
        if lane is None:
            return None
        if rtype == "run_started":
            return str(lane), {"run": (run_id, rec["seq"])}
        if rtype == "run_finished" and run_id is not None:
            return str(lane), {"close": run_id}
        return str(lane), {}
    if kind != "lane":
        return None
    change: dict[str, Any] = {}
    if "leafId" in op:
        change["leaf_id"] = op["leafId"]
    if op.get("config"):
        change["config"] = op["config"]
    return str(op["lane"]), change


def fold(lanes: dict[str, LaneState], op: dict[str, Any]) -> None:
    """Apply the numbered op ``op`` to ``lanes`` (by name; a missing lane is created)."""
    # What :func:`lane_change` says, applied without building the change (every committed op
    # comes through here; the two must agree: tests/storage/test_fold.py).
    kind = op.get("op")
    if kind == "entry":
        fold_entry(lanes, op)
        return
    if kind == "record":
        fold_record(lanes, op["record"])
        return
    found = lane_change(op)
    if found is None:
        return
    name, change = found
    lane = _lane(lanes, name)
    if "leaf_id" in change:
        lane.leaf_id = change["leaf_id"]
    if "config" in change:
        lane.config = {**lane.config, **change["config"]}


def fold_entry(lanes: dict[str, LaneState], op: dict[str, Any]) -> None:
    """:func:`fold` of a numbered entry op (``{"op": "entry", ...}``): its lane's leaf moves to
    it."""
    name = op.get("lane")
    if name is not None:
        lane = lanes.get(name)  # (the lane exists but once: no call to create it)
        if lane is None:
            lane = _lane(lanes, str(name))
        lane.leaf_id = op["entry"]["id"]


def fold_record(lanes: dict[str, LaneState], rec: dict[str, Any]) -> None:
    """:func:`fold` of a numbered record (the ``record`` of a record op): ``run_started`` opens
    its lane's run, ``run_finished`` closes it; any record with a lane creates the lane."""
    name = rec.get("lane")
    if name is None:
        return
    lane = _lane(lanes, str(name))
    rtype = rec.get("type")
    if rtype == "run_started":
        lane.run_id, lane.run_seq = rec.get("runId"), rec["seq"]
    elif rtype == "run_finished":
        run_id = rec.get("runId")
        if run_id is not None and lane.run_id == run_id:
            lane.run_id, lane.run_seq = None, None


def _lane(lanes: dict[str, LaneState], name: str) -> LaneState:
    """The lane ``name`` of ``lanes``, created if missing."""
    lane = lanes.get(name)
    if lane is None:
        lane = lanes[name] = LaneState(name)
    return lane


def copy_lane(lane: LaneState) -> LaneState:
    """A copy of ``lane`` whose ``config`` a caller may change."""
    return LaneState(lane.name, lane.leaf_id, dict(lane.config), lane.run_id, lane.run_seq)
