"""The storage contract as a plain model, and hypothesis strategies for commits to drive it
(used by ``test_stateful.py``): a commit is a list of op descriptors, resolved against the
model's state into real ops, sometimes with one op that makes the whole commit invalid."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from durable_harness.storage import (
    EntryOp,
    LaneOp,
    Op,
    RecordOp,
    SessionStore,
)

LANES = ["main", "side", "l2"]

_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec="utf-8"), max_size=8),
)
_payload = st.dictionaries(st.sampled_from(["a", "b", "text"]), _scalar, max_size=2)
_lane = st.sampled_from(LANES)
_config = st.dictionaries(st.sampled_from(["model", "thinking", "tools"]), _scalar, max_size=2)

# Op descriptors, resolved against the model's state when the commit is built.
_record = st.tuples(
    st.just("record"),
    st.sampled_from(["main", "main", "side", None]),
    st.sampled_from(["run_started", "run_finished", "tool_started", "note"]),
    st.integers(0, 2),
)
_by_kind = {
    "entry": st.tuples(st.just("entry"), st.none() | _lane, st.integers(0, 40), _payload),
    "record": _record,
    "move": st.tuples(st.just("move"), _lane, st.integers(-1, 40), st.none() | _config),
    "lane": st.tuples(st.just("lane"), _lane, _config),
}
_op = st.sampled_from(["entry", "entry", "record", "record", "record", "move", "lane"]).flatmap(
    _by_kind.__getitem__
)
# A commit: valid ops, sometimes with one op that makes the whole commit invalid.
commits = st.tuples(
    st.lists(_op, min_size=1, max_size=4),
    st.sampled_from([None, None, None, None, None, "bad_parent", "record_as_leaf"]),
    st.integers(0, 4),
).map(lambda c: c[0] if c[1] is None else [*c[0][: c[2]], (c[1],), *c[0][c[2] :]])


@dataclass
class Model:
    """The contract of ``storage/base.py`` written as plainly as possible."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    lanes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seq: int = 0
    n: int = 0

    def lane(self, name: str) -> dict[str, Any]:
        return self.lanes.setdefault(
            name, {"leaf_id": None, "config": {}, "run_id": None, "run_seq": None}
        )

    def __post_init__(self) -> None:
        self.lane("main")

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def build(self, descs: list[tuple[Any, ...]]) -> tuple[list[Op], bool]:
        """Resolve descriptors into ops; return them and whether the commit must be refused."""
        scratch = copy.deepcopy(self)  # ops see entries added earlier in the same commit
        ops: list[Op] = []
        valid = True
        for desc in descs:
            kind = desc[0]
            if kind == "entry":
                _, lane, sel, payload = desc
                known = [e["id"] for e in scratch.entries]
                if sel == 0 or not known:
                    parent = scratch.lane(lane or "main")["leaf_id"]
                else:
                    parent = known[(sel - 1) % len(known)]
                entry = {"type": "custom", "id": self.fresh("e"), "parentId": parent, **payload}
                ops.append(EntryOp(entry, lane=lane))
            elif kind == "bad_parent":
                ops.append(EntryOp({"type": "custom", "id": self.fresh("e"), "parentId": "ghost"}))
                valid = False
            elif kind == "record_as_leaf":
                # A leaf must be an entry: a record id of the same commit does not qualify.
                rid = self.fresh("r")
                ops.append(RecordOp({"type": "note", "id": rid}))
                ops.append(LaneOp("main", leaf_id=rid))
                valid = False
                continue
            elif kind == "move":
                _, lane, sel, config = desc
                known = [e["id"] for e in scratch.entries]
                leaf = None if sel < 0 or not known else known[sel % len(known)]
                ops.append(LaneOp(lane, leaf_id=leaf, config=config))
            elif kind == "lane":
                _, lane, config = desc
                ops.append(LaneOp(lane, config=config))
            else:
                _, lane, rtype, sel = desc
                record: dict[str, Any] = {"type": rtype, "id": self.fresh("r"), "lane": lane}
                if rtype == "run_started":
                    record["runId"] = self.fresh("run")
                elif rtype in ("run_finished", "tool_started"):
                    current = scratch.lane(lane)["run_id"] if lane else None
                    record["runId"] = current if sel == 0 and current else f"run-x{sel}"
                ops.append(RecordOp(record))
            scratch.apply(ops[-1:])
        return ops, valid

    def apply(self, ops: list[Op]) -> None:
        """Apply an acknowledged commit: one seq per op, lanes and runs as the contract says."""
        for op in ops:
            self.seq += 1
            if isinstance(op, EntryOp):
                self.entries.append({**op.entry, "seq": self.seq})
                if op.lane is not None:
                    self.lane(op.lane)["leaf_id"] = op.entry["id"]
            elif isinstance(op, RecordOp):
                rec = {**op.record, "seq": self.seq}
                self.records.append(rec)
                if rec.get("lane") is not None:
                    lane = self.lane(rec["lane"])
                    if rec["type"] == "run_started":
                        lane["run_id"], lane["run_seq"] = rec["runId"], self.seq
                    elif rec["type"] == "run_finished" and lane["run_id"] == rec.get("runId"):
                        lane["run_id"], lane["run_seq"] = None, None
            else:
                lane = self.lane(op.lane)
                if op.sets_leaf():
                    lane["leaf_id"] = op.leaf_id
                if op.config:
                    lane["config"].update(op.config)

    def view(self) -> dict[str, Any]:
        """Entries, records, lanes and the last seq, as :func:`view` reads them from a store."""
        return {
            "entries": self.entries,
            "records": self.records,
            "lanes": self.lanes,
            "last_seq": self.seq,
        }


def view(s: SessionStore) -> dict[str, Any]:
    """What a session exposes, in the shape of :meth:`Model.view`."""
    return {
        "entries": s.iter_entries(),
        "records": s.records(),
        "lanes": {
            k: {"leaf_id": v.leaf_id, "config": v.config, "run_id": v.run_id, "run_seq": v.run_seq}
            for k, v in s.lanes().items()
        },
        "last_seq": s.last_seq(),
    }
