"""The shared in-memory index of a session (parents, types, seqs, lanes, records; content in the
backend), used by the memory and JSONL backends; ``apply`` enforces the SQL backends' rules."""

from __future__ import annotations

import threading
from typing import Any

import orjson

from durable_harness.errors import (
    InvalidOp,
    ReadOnlySession,
    UnknownEntry,
)
from durable_harness.storage import codec
from durable_harness.storage.base import (
    Durability,
    EntryOp,
    LaneOp,
    LaneState,
    Op,
    RecordFilter,
    RecordOp,
    SessionStore,
)
from durable_harness.storage.fold import copy_lane, fold, fold_entry, fold_record, number
from durable_harness.storage.oserrors import boundary
from durable_harness.storage.shapes import (
    checked_id,
    id_conflict,
    op_shape_error,
    record_shape_error,
)


class IndexedSessionStore(SessionStore):
    """Base for backends that index the whole session in memory (:meth:`_persist`,
    :meth:`_load_entry`)."""

    def __init__(
        self, header: dict[str, Any], *, read_only: bool, durability: Durability, location: str
    ) -> None:
        self.header = header
        self.session_id = str(header.get("id", ""))
        self.read_only = read_only
        self.generation = 0
        self.durability = durability
        self.location = location
        self.damage = []
        self._meta: dict[str, tuple[str | None, str, int, Any]] = {}
        self._order: list[str] = []
        self._lanes: dict[str, LaneState] = {"main": LaneState("main")}
        self._log: list[dict[str, Any]] = []  # the records
        self._record_ids: set[str] = set()
        self._seq = 0
        self._lock = threading.RLock()
        self._closed = False

    # -- reading (the index is memory; only entry content may live in a file) --------------
    @boundary
    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        meta = self._meta.get(entry_id)
        if meta is None:
            return None
        return self._load_entry(entry_id, meta[3])

    @boundary
    def iter_entries(self, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            order = list(self._order)
        return [
            self._load_entry(i, self._meta[i][3])
            for i in order
            if types is None or self._meta[i][1] in types
        ]

    def entry_count(self) -> int:
        return len(self._order)

    def lanes(self) -> dict[str, LaneState]:
        with self._lock:
            return {k: copy_lane(v) for k, v in self._lanes.items()}

    def lane(self, name: str) -> LaneState:
        with self._lock:
            v = self._lanes.get(name)
            return LaneState(name) if v is None else copy_lane(v)

    def lane_leaf(self, name: str) -> str | None:
        with self._lock:
            v = self._lanes.get(name)
            return None if v is None else v.leaf_id

    def _records(self, where: RecordFilter) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._log if where(r)]

    def last_seq(self) -> int:
        return self._seq

    # -- writing ---------------------------------------------------------------------------
    def _check_ops(self, ops: list[Op]) -> None:
        # Entry ids and record ids are separate namespaces (as in SQL): a parent or a leaf
        # must name an entry, never a record committed in the same batch. Written flat (no
        # per-commit dict of sets, the location named only on an error, a record's envelope
        # checked without the generic dispatch): it runs on every commit ("Turn cost" in
        # design/storage.md and design/run-loop.md).
        meta = self._meta
        new_entries: set[str] = set()
        new_records: set[str] = set()
        for op in ops:
            if type(op) is RecordOp:
                rec = op.record
                problem = record_shape_error(rec) if isinstance(rec, dict) else op_shape_error(op)
                if problem is not None:
                    raise InvalidOp(f"session {self.session_id}: {problem}", op="RecordOp")
                ident = rec.get("id")
                if not isinstance(ident, str) or not ident:
                    ident = checked_id("record", rec)
                if ident in self._record_ids or ident in new_records:
                    raise id_conflict("record", ident, f"session {self.session_id}")
                new_records.add(ident)
                continue
            problem = op_shape_error(op)
            if problem is not None:
                raise InvalidOp(f"session {self.session_id}: {problem}", op=type(op).__name__)
            if isinstance(op, LaneOp):
                leaf = op.leaf_id if op.sets_leaf() else None
                if leaf is not None and leaf not in meta and leaf not in new_entries:
                    raise UnknownEntry(
                        f"leaf {leaf} does not exist in session {self.session_id}", entry_id=leaf
                    )
            elif isinstance(op, EntryOp):
                body = op.entry
                ident = body.get("id")
                if not isinstance(ident, str) or not ident:
                    ident = checked_id("entry", body)
                if ident in meta or ident in new_entries:
                    raise id_conflict("entry", ident, f"session {self.session_id}")
                parent = body.get("parentId")
                if parent is not None and parent not in meta and parent not in new_entries:
                    raise UnknownEntry(
                        f"parent {parent} of entry {ident} does not exist in session "
                        f"{self.session_id}",
                        entry_id=parent,
                    )
                new_entries.add(ident)
            else:
                ident = checked_id("record", op.record)
                if ident in self._record_ids or ident in new_records:
                    raise id_conflict("record", ident, f"session {self.session_id}")
                new_records.add(ident)

    def _number(self, ops: list[Op]) -> list[dict[str, Any]]:
        """Assign seqs and return the serialisable op dicts (the JSONL line's ``ops``)."""
        return number(ops, self._seq)

    def _apply(self, op: dict[str, Any], location: Any) -> None:
        """Apply one numbered op dict to the index (on open and after a commit)."""
        kind = op.get("op")
        if kind == "entry":
            entry = op["entry"]
            eid, seq = entry["id"], entry["seq"]
            self._meta[eid] = (entry.get("parentId"), entry.get("type", ""), seq, location)
            self._order.append(eid)
            if seq > self._seq:
                self._seq = seq
            fold_entry(self._lanes, op)
            return
        if kind == "record":
            rec = op["record"]
            self._log.append(rec)
            self._record_ids.add(rec["id"])
            if rec["seq"] > self._seq:
                self._seq = rec["seq"]
            fold_record(self._lanes, rec)
            return
        if kind == "lane":
            self._seq = max(self._seq, int(op.get("seq", 0)))
        fold(self._lanes, op)

    @boundary
    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        if self.read_only:
            raise ReadOnlySession(f"session {self.session_id} at {self.location} is open read-only")
        if not ops:
            return self._seq
        with self._lock:
            self._check_ops(ops)
            numbered = self._number(ops)
            locations = self._persist(numbered, wait)
            for op, loc in zip(numbered, locations, strict=True):
                self._apply(op, loc)
            return self._seq

    def _persist(self, numbered: list[dict[str, Any]], sync: bool) -> list[Any]:
        """Write one commit (durable per the mode with ``sync``); a content location per op.
        Under the lock."""
        raise NotImplementedError

    def _load_entry(self, entry_id: str, location: Any) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        self._closed = True


class MemorySessionStore(IndexedSessionStore):
    """The reference backend: everything in memory, nothing durable (pi files opened in place, the
    ``memory:`` store, the model in agreement tests). Entries are kept encoded and every read
    decodes a private copy; a writable session is generation 1."""

    def __init__(
        self, header: dict[str, Any], *, read_only: bool = False, location: str = "memory"
    ) -> None:
        super().__init__(header, read_only=read_only, durability="none", location=location)
        self.generation = 0 if read_only else 1

    def _persist(self, numbered: list[dict[str, Any]], sync: bool) -> list[Any]:
        try:  # the common case: everything encodes as it is (records in one call)
            out: list[Any] = []
            records: list[Any] = []
            for op in numbered:
                if "entry" in op:
                    out.append(orjson.dumps(op["entry"]))
                    continue
                if "record" in op:
                    records.append(op["record"])
                out.append(None)
            if records:
                orjson.dumps(records)
            return out
        except orjson.JSONEncodeError:
            pass  # a lone surrogate to scrub, or a value JSON cannot hold: op by op, in order
        try:
            out = []
            for op in numbered:
                if "entry" in op:
                    out.append(codec.dumps(op["entry"]))
                    continue
                if "record" in op:  # kept as a file backend would read it back
                    op["record"] = codec.dumps_held(op["record"])[1]
                out.append(None)
            return out
        except TypeError as exc:  # what a file backend could not write either
            raise InvalidOp(
                f"session {self.session_id}: an entry holds a value JSON cannot represent: {exc}"
            ) from exc

    def _load_entry(self, entry_id: str, location: Any) -> dict[str, Any]:
        if isinstance(location, bytes):
            entry: dict[str, Any] = codec.loads(location)
            return entry
        copied: dict[str, Any] = codec.loads(codec.dumps(location))  # loaded in place (pi)
        return copied

    def load(self, numbered: list[dict[str, Any]]) -> None:
        """Apply already-numbered ops without checks (used when migrating a file in memory)."""
        for op in numbered:
            self._apply(op, op.get("entry"))

    def reader(self) -> MemorySessionStore:
        """A read-only view sharing the index (sees every commit); closing it leaves this open."""
        return _MemoryReader(self)


class _MemoryReader(MemorySessionStore):
    """See :meth:`MemorySessionStore.reader`."""

    def __init__(self, writer: MemorySessionStore) -> None:
        self.__dict__.update(writer.__dict__)
        self.read_only, self.generation, self._closed = True, 0, False
        self._writer = writer

    def last_seq(self) -> int:
        return self._writer.last_seq()
