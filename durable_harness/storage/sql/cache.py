"""The writer's cache of one SQL session, for both dialects: what the holder of the writer lease
itself committed (``last_seq``, every lane, the bodies of its recent entries), so the reads a run
makes every turn (its lane's leaf, that leaf's entry, the last seq) take no query
(``design/storage.md``, "The writer's cache").

It is right only while its session holds the writer lease (no one else may write the session)
and only for commits known to have landed: the owner folds a commit in after it is committed
(:meth:`WriterCache.fold`), drops the cache on any doubt (:meth:`WriterCache.drop`: a commit
that failed for a reason other than its own input, a transaction that may have rolled back part
of what it wrote) and reloads it from the database before the next read (:meth:`WriterCache.load`).
Lanes move by the one fold every backend applies (:func:`~durable_harness.storage.fold.fold`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from durable_harness.storage import codec
from durable_harness.storage.base import LaneState
from durable_harness.storage.fold import fold


class WriterCache:
    """``last_seq``, every lane and up to ``bodies`` recent entry bodies (encoded) of one session,
    as its writer committed them; ``ok`` is False until :meth:`load` and after :meth:`drop`.

    Not locked: the owner serialises its use (its session lock)."""

    def __init__(self, bodies: int) -> None:
        """An empty cache (``ok`` False) keeping at most ``bodies`` entry bodies (the oldest
        written or read first out)."""
        self.ok = False
        self.last_seq = 0
        self.lanes: dict[str, LaneState] = {}
        self._limit = bodies
        self._bodies: OrderedDict[str, bytes] = OrderedDict()

    def load(self, last_seq: int, lanes: Iterable[LaneState]) -> None:
        """Start again from the database's ``last_seq`` and lane rows (``ok`` becomes True; the
        entry bodies kept are still right: entries never change)."""
        self.last_seq = last_seq
        self.lanes = {lane.name: lane for lane in lanes}
        self.ok = True

    def drop(self) -> None:
        """Forget the lanes and the last seq (reload before the next read) and every body."""
        self.ok = False
        self._bodies.clear()

    def remember(self, entry_id: str, body: bytes) -> None:
        """Keep an entry's encoded ``body`` (one written or read by this writer)."""
        self._bodies[entry_id] = body
        if len(self._bodies) > self._limit:
            self._bodies.popitem(last=False)

    def entry(self, entry_id: str) -> dict[str, Any] | None:
        """A private decoded copy of a kept entry, or ``None`` (not kept: ask the database)."""
        body = self._bodies.get(entry_id)
        if body is None:
            return None
        value = codec.loads(body)
        return value if isinstance(value, dict) else None

    def fold(
        self, numbered: Iterable[dict[str, Any]], bodies: dict[str, bytes] | None = None
    ) -> None:
        """Fold committed, numbered ops (:func:`~durable_harness.storage.fold.number`'s dicts)
        into the lanes and ``last_seq``, and keep their entries (``bodies``: their encodings
        when the caller already has them, by entry id). Before a :meth:`load` only the entries
        count: the load replaces the lanes and the last seq."""
        for op in numbered:
            if op["op"] == "entry":
                entry = op["entry"]
                ident = str(entry["id"])
                got = bodies.get(ident) if bodies is not None else None
                self.remember(ident, got if got is not None else codec.dumps(entry))
                seq = entry["seq"]
            elif op["op"] == "record":
                seq = op["record"]["seq"]
            else:
                seq = op["seq"]
                if op.get("config"):  # as stored (a tuple is a list...), and not the caller's dict
                    op = {**op, "config": codec.loads(codec.dumps(op["config"]))}
            fold(self.lanes, op)
            if seq > self.last_seq:
                self.last_seq = seq

    def lane(self, name: str) -> LaneState:
        """A copy of lane ``name`` (an empty lane when it has no row yet)."""
        got = self.lanes.get(name)
        return LaneState(name) if got is None else _copy(got)

    def leaf(self, name: str) -> str | None:
        """Lane ``name``'s leaf entry id (``None``: no entry yet, or no such lane), no copy."""
        got = self.lanes.get(name)
        return None if got is None else got.leaf_id

    def all_lanes(self) -> dict[str, LaneState]:
        """A copy of every lane, ``main`` always among them."""
        out = {k: _copy(v) for k, v in self.lanes.items()}
        out.setdefault("main", LaneState("main"))
        return out


def _copy(lane: LaneState) -> LaneState:
    """A copy of ``lane`` sharing nothing with the cache (its ``config`` copied deeply: a
    caller changing a list in it changes only its copy)."""
    config = codec.loads(codec.dumps(lane.config)) if lane.config else {}
    return LaneState(lane.name, lane.leaf_id, config, lane.run_id, lane.run_seq)
