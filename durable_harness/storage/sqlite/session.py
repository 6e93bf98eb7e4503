"""One session inside a SQLite database: the SQL core's reads, and commits as fenced ``BEGIN
IMMEDIATE`` transactions on the store's shared connections (``design/storage.md`` "SQLite")."""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from durable_harness.errors import (
    ReadOnlySession,
    SessionClosed,
    SessionNotFound,
    StaleGeneration,
    StorageError,
    UnknownEntry,
)
from durable_harness.ids import now_iso
from durable_harness.storage import codec, timing
from durable_harness.storage.base import Durability, LaneState, Op
from durable_harness.storage.fold import lane_change, number
from durable_harness.storage.lease import FileLease
from durable_harness.storage.oserrors import boundary
from durable_harness.storage.shapes import checked_id, id_conflict
from durable_harness.storage.sql.cache import WriterCache
from durable_harness.storage.sql.session import LANES, SqlSessionStore, lane_row
from durable_harness.storage.sqlite import group_commit
from durable_harness.storage.sqlite.connection import read_snapshot, rollback
from durable_harness.storage.sqlite.database import SharedDatabase
from durable_harness.storage.sqlite.group_commit import GroupQueues, SessionCommit

RECENT_ENTRIES = 4096  # committed entry ids remembered for parent checks (then started afresh)
RECENT_BODIES = 256
"""Entry bodies the writer's cache keeps (``storage/sql/cache.py``): a run reads back the few it
just wrote (its leaf); an older one is one indexed query away."""


class SqliteSessionStore(SqlSessionStore):
    """One session inside a SQLite database, opened through :class:`SqliteStore`."""

    @boundary
    def __init__(
        self,
        db_path: str,
        session_id: str,
        *,
        read_only: bool,
        durability: Durability,
        lease: FileLease | None,
        break_lease: bool = False,
        conn: sqlite3.Connection | None = None,
        shared: SharedDatabase | None = None,
        queues: GroupQueues | None = None,
    ) -> None:
        """Open ``session_id`` of the database at ``db_path`` through ``shared`` (released at
        :meth:`close`) and ``queues``, or a database of its own on ``conn`` (``fsck``'s
        read-only).

        Raises:
            SessionNotFound: no such session. LeaseHeld: ``lease`` is held by a live process.
        """
        self.db_path = db_path
        self.session_id = session_id
        self.read_only = read_only
        self.durability = durability
        self.location = f"sqlite:{db_path}#{session_id}"
        self._damage: list[dict[str, Any]] | None = None
        self._lease = lease
        self._lock = threading.RLock()  # the damage list
        if shared is None:
            shared = SharedDatabase(db_path, conn)
            shared.acquire()
        self._shared = shared
        self._queues = queues or GroupQueues()
        # entry ids and lanes known to exist (never deleted), made by the open transaction or
        # recent committed ones: no lookup, no INSERT OR IGNORE (the writer's lock held)
        self._txn_entries: set[str] = set()
        self._recent_entries: set[str] = set()
        self._txn_lanes: set[str] = set()
        self._known_lanes: set[str] = set()
        self._ticket = 0  # the shared writer's ticket of this session's last commit
        # the writer's cache (storage/sql/cache.py) and what the open transaction wrote, folded
        # into it once committed (note_committed) or dropping it when possibly rolled back
        self._cache = WriterCache(RECENT_BODIES)
        self._txn_ops: list[dict[str, Any]] = []
        self._txn_bodies: dict[str, bytes] = {}
        self._fenced = False  # a commit found another holder: the cache is no longer right
        self.closed = False
        try:
            with shared.read_lock:
                row = shared.reader.execute(
                    "SELECT header, generation FROM sessions WHERE id=?", (session_id,)
                ).fetchone()
            if row is None:
                raise SessionNotFound(
                    f"no session {session_id} in {db_path}", session_id=session_id
                )
            self.header = codec.loads(row[0])
            self.generation = 0
            if lease is not None:
                self.generation = lease.acquire(floor=int(row[1]), break_lease=break_lease)
                with shared.lock:
                    shared.writer.execute(
                        "UPDATE sessions SET generation=? WHERE id=?", (self.generation, session_id)
                    )
                    self._ticket = shared.note_commit(0)
        except BaseException:
            # A refused open (LeaseHeld, missing session) must not leak the connections.
            shared.release()
            raise

    # -- reading (the queries: storage/sql/session.py) -----------------------------------
    def _read(self, sql: str, args: Any) -> list[Any]:
        """Every row of one query on the shared reader (errors left as raised)."""
        with self._shared.read_lock:
            return self._shared.reader.execute(sql, args).fetchall()

    _rows = boundary(_read)

    def _cached(self) -> bool:
        """True when reads may be answered from the writer's cache (this session holds the
        writer lease), loading it first if needed (``_lock`` held by the caller)."""
        if self._lease is None or self.read_only or self.closed or self._fenced:
            return False
        if not self._cache.ok:
            head, lanes = self._snapshot(
                ["SELECT last_seq FROM sessions WHERE id=?", LANES]  # both bound to the id
            )
            if not head:
                return False  # deleted: the query path reports it
            self._cache.load(int(head[0][0]), (lane_row(r) for r in lanes))
        return True

    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        with self._lock:
            kept = self._cache.entry(entry_id) if self._cached() else None
        return kept if kept is not None else super().get_entry(entry_id)

    def lanes(self) -> dict[str, LaneState]:
        with self._lock:
            if self._cached():
                return self._cache.all_lanes()
        return super().lanes()

    def lane(self, name: str) -> LaneState:
        with self._lock:
            if self._cached():
                return self._cache.lane(name)
        return super().lane(name)

    def lane_leaf(self, name: str) -> str | None:
        with self._lock:
            if self._cached():
                return self._cache.leaf(name)
        return super().lane(name).leaf_id

    def last_seq(self) -> int:
        with self._lock:
            if self._cached():
                return self._cache.last_seq
        return super().last_seq()

    @boundary
    def _snapshot(self, queries: list[str]) -> list[list[Any]]:
        with self._lock, self._shared.read_lock, read_snapshot(self._shared.reader):
            return [self._shared.reader.execute(q, (self.session_id,)).fetchall() for q in queries]

    def _scan_queries(self) -> list[str]:
        """Before schema 2 lane ops had no rows: seqs checked from ``last_seq``."""
        queries = super()._scan_queries()
        if self._shared.schema >= 2:
            return queries
        return [queries[0].replace("checked_from", "last_seq"), *queries[1:3]]

    # -- writing ---------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlySession(f"session {self.location} is open read-only")
        if self.closed:
            raise SessionClosed(f"session {self.location} is closed")

    @boundary
    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        """Commit ``ops`` in a transaction of its own, or (``batch`` and ``wait``) in the next
        group.

        Raises:
            as :meth:`SessionStore.commit`; SessionClosed: the session was closed.
        """
        self._check_writable()
        if not ops:
            return self.last_seq()
        started = timing.start()
        shared = self._shared
        if self.durability == "batch" and wait:
            seq = self._queues.threads.commit(SessionCommit(self, list(ops)), self._run_group)
        else:
            with shared.lock:
                if self.closed:
                    raise SessionClosed(f"session {self.location} is closed")
                c = shared.writer
                c.execute("BEGIN IMMEDIATE")
                self.forget_txn()
                try:
                    seq = self.apply_ops(ops, self._fence())
                    c.execute(
                        "UPDATE sessions SET last_seq=?, modified=? WHERE id=?",
                        (seq, now_iso(), self.session_id),
                    )
                    c.execute("COMMIT")
                except BaseException:
                    rollback(c)
                    raise
                self.note_committed(shared.note_commit(1))
            if wait and self.durability != "none":
                shared.sync_to(self._ticket)
        timing.since("commit", started)
        return seq

    @boundary
    async def commit_async(self, ops: list[Op]) -> int:
        """Commit ``ops`` and await its durability; in ``batch`` mode as a call of the store's next
        group (raises as :meth:`commit`)."""
        if self.durability != "batch":
            return self.commit(ops)
        self._check_writable()
        if not ops:
            return self.last_seq()
        started = timing.start()
        seq = await self._queues.tasks.commit(SessionCommit(self, list(ops)), self._run_group)
        timing.since("commit", started)
        return seq

    def _run_group(self, batch: list[SessionCommit]) -> None:
        group_commit.run_group(self._shared, self._queues, batch)

    def note_committed(self, ticket: int) -> None:
        """After a COMMIT with this session's calls: keep its entries, lanes, ticket."""
        if len(self._recent_entries) > RECENT_ENTRIES:
            self._recent_entries.clear()
        self._recent_entries |= self._txn_entries
        self._known_lanes |= self._txn_lanes
        with self._lock:  # its lanes are replaced by the next load if it is not ``ok``
            self._cache.fold(self._txn_ops, self._txn_bodies)
            self._txn_ops, self._txn_bodies = [], {}
        self.forget_txn()
        self._ticket = ticket

    def forget_txn(self) -> None:
        """Forget what the open transaction made (the writer's cache too, if it made anything:
        part of it may have been rolled back)."""
        self._txn_entries.clear()
        self._txn_lanes.clear()
        if self._txn_ops:
            with self._lock:
                self._cache.drop()
                self._txn_ops, self._txn_bodies = [], {}

    @boundary
    def wait_durable(self) -> None:
        """Make this session's commits so far durable (one WAL sync at most)."""
        if self.durability != "none" and not self.read_only:
            self._shared.sync_to(self._ticket)

    @boundary
    async def wait_durable_async(self) -> None:
        """As :meth:`wait_durable`; in ``batch`` mode as a call of the next group (barriers share
        a sync)."""
        if self.durability != "batch" or self.read_only:
            self.wait_durable()
        elif self._shared.synced < self._ticket:
            await self._queues.tasks.commit(SessionCommit(self, []), self._run_group)

    def _fence(self) -> int:
        """Inside the open transaction: check this writer's generation, return ``last_seq``."""
        row = self._shared.writer.execute(
            "SELECT generation, last_seq FROM sessions WHERE id=?", (self.session_id,)
        ).fetchone()
        if row is None or int(row[0]) != self.generation:
            raise self.stale_error(None if row is None else int(row[0]))
        return int(row[1])

    def stale_error(self, current: int | None) -> StorageError:
        """The error of a fence that found generation ``current`` (``None``: gone); from now on
        every read goes to the database (another writer may be writing this session)."""
        with self._lock:
            self._fenced = True
            self._cache.drop()
        if current is None:
            return SessionNotFound(
                f"session {self.location} no longer exists; the append was refused",
                session_id=self.session_id,
            )
        return StaleGeneration(
            f"session {self.location}: this writer holds generation {self.generation} but "
            f"the lease is now at generation {current}; the append was refused",
            generation=self.generation,
            current=current,
        )

    def apply_ops(self, ops: list[Op], seq: int) -> int:
        """Insert ``ops`` after ``seq`` inside the open transaction, each row then its lane change;
        return the last seq (raises as :meth:`commit`)."""
        self._check_shapes(ops)
        numbered = number(ops, seq)
        self._txn_ops.extend(numbered)
        for op in numbered:
            if op["op"] == "entry":
                self._insert("entries", op["entry"], (op["entry"].get("parentId"),))
            elif op["op"] == "record":
                rec = op["record"]
                self._insert("records", rec, (rec.get("lane"), rec.get("runId")))
            elif self._shared.schema >= 2:
                body = {k: v for k, v in op.items() if k != "op"}
                self._shared.writer.execute(
                    "INSERT INTO lane_ops (session_id, seq, lane, body) VALUES (?,?,?,?)",
                    (self.session_id, op["seq"], op["lane"], codec.dumps(body)),
                )
            self._change_lane(op)
        return seq + len(ops)

    def _insert(self, table: str, body: dict[str, Any], extra: tuple[Any, ...]) -> None:
        """Insert one entry (``extra``: its parent) or record (its lane and run) row."""
        what, parent = ("entry" if table == "entries" else "record"), extra[0]
        ident = checked_id(what, body)
        if table == "entries" and (
            parent is not None
            and parent not in self._txn_entries
            and parent not in self._recent_entries
            and not self._exists(parent)
        ):
            raise UnknownEntry(
                f"parent {parent} of entry {ident} does not exist in {self.location}",
                entry_id=parent,
            )
        columns = "parent_id" if table == "entries" else "lane, run_id"
        marks = ",".join("?" * (5 + len(extra)))
        encoded = codec.dumps(body)
        try:
            self._shared.writer.execute(
                f"INSERT INTO {table} (session_id, id, seq, {columns}, type, body) "
                f"VALUES ({marks})",
                (
                    self.session_id,
                    ident,
                    body["seq"],
                    *extra,
                    str(body.get("type", "")),
                    encoded,
                ),
            )
        except sqlite3.IntegrityError as exc:
            raise id_conflict(what, ident, self.location) from exc
        if table == "entries":
            self._txn_entries.add(ident)
            self._txn_bodies[ident] = encoded

    def _exists(self, entry_id: str) -> bool:
        row = self._shared.writer.execute(
            "SELECT 1 FROM entries WHERE session_id=? AND id=?", (self.session_id, entry_id)
        ).fetchone()
        return row is not None

    def _change_lane(self, op: dict[str, Any]) -> None:
        """Write the lane change of the numbered ``op``."""
        found = lane_change(op)
        if found is None:
            return
        name, change = found
        run = self._shared.writer.execute
        where = (self.session_id, name)
        if op["op"] == "entry":  # create the lane or move its leaf: one upsert
            run(
                "INSERT INTO lanes (session_id, name, leaf_id, config) VALUES (?, ?, ?, '{}') "
                "ON CONFLICT (session_id, name) DO UPDATE SET leaf_id=excluded.leaf_id",
                (*where, change["leaf_id"]),
            )
            self._txn_lanes.add(name)
            return
        if name not in self._known_lanes and name not in self._txn_lanes:
            run("INSERT OR IGNORE INTO lanes (session_id, name, config) VALUES (?, ?, '{}')", where)
            self._txn_lanes.add(name)
        leaf = change.get("leaf_id")
        if "leaf_id" in change:
            if leaf is not None and not self._exists(leaf):
                raise UnknownEntry(f"leaf {leaf} does not exist in {self.location}", entry_id=leaf)
            run("UPDATE lanes SET leaf_id=? WHERE session_id=? AND name=?", (leaf, *where))
        if "config" in change:
            row = run("SELECT config FROM lanes WHERE session_id=? AND name=?", where).fetchone()
            config = codec.dumps({**codec.loads(row[0]), **change["config"]})
            run("UPDATE lanes SET config=? WHERE session_id=? AND name=?", (config, *where))
        if "run" in change:
            run(
                "UPDATE lanes SET run_id=?, run_seq=? WHERE session_id=? AND name=?",
                (*change["run"], *where),
            )
        elif "close" in change:
            run(
                "UPDATE lanes SET run_id=NULL, run_seq=NULL WHERE session_id=? AND name=? "
                "AND run_id=?",
                (*where, change["close"]),
            )

    @boundary
    def lease_holder(self) -> dict[str, Any] | None:
        if self._lease is not None:
            return self._lease.probe()
        lock = os.path.join(self.db_path + ".locks", f"{self.session_id}.lock")
        return FileLease(lock, self.location).probe()

    @boundary
    def close(self) -> None:
        """Commit the store's queued grouped calls, make this session's commits durable, release the
        lease and the shared connections. Idempotent."""
        if self.closed:
            return
        shared = self._shared
        try:
            if not self.read_only:
                batch = self._queues.tasks.take()
                if batch:
                    self._run_group(batch)
                with shared.lock:
                    self.closed = True
                self.wait_durable()
        finally:
            self.closed = True
            shared.release()
            if self._lease is not None:
                self._lease.release()
                self._lease = None
