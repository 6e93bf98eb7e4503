"""One session inside a SQLite database (:class:`SqliteSessionStore`): reads, and commits as
``BEGIN IMMEDIATE`` transactions fenced by the session's lease generation.

A commit first checks the session's fencing generation, then inserts entries and records,
updates lanes and ``last_seq``. A session's connection runs ``PRAGMA synchronous=NORMAL``
(``OFF`` for ``none``) and the store fsyncs the WAL itself: at once for a waited commit, at the
next barrier for ``commit(wait=False)``. ``batch`` is group commit: commits that arrive while a
transaction runs are applied together in the next one; a call that fails is rolled back alone
(the group is rerun with a savepoint per call).

Every seq has a row (lane ops in ``lane_ops``) and ``sessions.last_seq`` is the durable
high-water mark, so :meth:`SqliteSessionStore.scan` finds a deleted row as a hole below it; the
scan runs the first time ``damage`` is read (``design/storage.md``, "Every damage kind").
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from durable_harness.errors import (
    IdConflict,
    InvalidOp,
    ReadOnlySession,
    SessionNotFound,
    StaleGeneration,
    UnknownEntry,
)
from durable_harness.ids import now_iso
from durable_harness.storage import codec
from durable_harness.storage.barrier_trace import BarrierTrace, open_trace, wal_commit_end
from durable_harness.storage.base import (
    Durability,
    EntryOp,
    LaneOp,
    LaneState,
    Op,
    PendingCommit,
    RecordOp,
    SessionStore,
    queued_commit,
)
from durable_harness.storage.lease import FileLease
from durable_harness.storage.shapes import op_shape_error
from durable_harness.storage.sqlite import connection
from durable_harness.storage.sqlite.connection import rollback, schema_version
from durable_harness.storage.sqlite.scan import bad_row, row_problem, scan_session

RECENT_ENTRIES = 4096  # committed entry ids remembered for parent checks (then started afresh)


class SqliteSessionStore(SessionStore):
    """One session inside a SQLite database. Opened through :class:`SqliteStore`."""

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
    ) -> None:
        """Open session ``session_id`` of the database at ``db_path``; ``conn`` (a read-only
        connection from :func:`connect_read_only`) replaces the store's own connection.

        Raises:
            SessionNotFound: no such session in the database.
            LeaseHeld: ``lease`` is held by another live process.
        """
        self.db_path = db_path
        self.session_id = session_id
        self.read_only = read_only
        self.durability = durability
        self.location = f"sqlite:{db_path}#{session_id}"
        self._damage: list[dict[str, Any]] | None = None
        self._lease = lease
        self._lock = threading.RLock()
        self._cond = threading.Condition()
        self._queue: list[PendingCommit] = []
        self._async_queue: list[PendingCommit] = []  # commit_async calls waiting for their group
        # Entry ids known to exist (entries are never deleted): made by the open transaction,
        # and by recent committed ones. A parent found here is not looked up.
        self._txn_entries: set[str] = set()
        self._recent_entries: set[str] = set()
        self._leader = False
        # Session commits do not let SQLite fsync (NORMAL: no WAL sync at commit); this store
        # fsyncs the WAL itself, at once for a waited commit and at the next barrier for
        # commit(wait=False), as the JSONL backend does (see _sync_wal).
        self._conn = conn or connection.connect(
            db_path, "OFF" if durability == "none" else "NORMAL"
        )
        self._schema = schema_version(self._conn)
        self._wal_fd: int | None = None
        self._trace: BarrierTrace | None = None  # power-cut tests only (storage/barrier_trace.py)
        self._unsynced = False
        try:
            row = self._conn.execute(
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
                self._conn.execute(
                    "UPDATE sessions SET generation=? WHERE id=?", (self.generation, session_id)
                )
                self._trace = open_trace(db_path)
                if self._trace is not None:  # the trace starts here: the WAL as found is durable
                    end, salt = wal_commit_end(db_path + "-wal")
                    self._trace.record(end, salt=salt)
        except BaseException:
            # A refused open (LeaseHeld, missing session) must not leak the connection.
            self._conn.close()
            raise
        self._closed = False

    # -- reading ---------------------------------------------------------------------------
    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT id, seq, body FROM entries WHERE session_id=? AND id=?",
                (self.session_id, entry_id),
            ).fetchone()
        return None if row is None else self._decode("entries", *row)

    def iter_entries(self, types: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT id, seq, body FROM entries WHERE session_id=?", [self.session_id]
        if types is not None:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            args.extend(types)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY seq", args).fetchall()
        return [d for r in rows if (d := self._decode("entries", *r)) is not None]

    def entry_count(self) -> int:
        with self._lock:
            return int(
                self._conn.execute(
                    "SELECT COUNT(*) FROM entries WHERE session_id=?", (self.session_id,)
                ).fetchone()[0]
            )

    def lanes(self) -> dict[str, LaneState]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, leaf_id, config, run_id, run_seq FROM lanes WHERE session_id=?",
                (self.session_id,),
            ).fetchall()
        out = {r[0]: LaneState(r[0], r[1], codec.loads(r[2]), r[3], r[4]) for r in rows}
        out.setdefault("main", LaneState("main"))
        return out

    def lane(self, name: str) -> LaneState:
        with self._lock:
            r = self._conn.execute(
                "SELECT name, leaf_id, config, run_id, run_seq FROM lanes WHERE session_id=? "
                "AND name=?",
                (self.session_id, name),
            ).fetchone()
        return (
            LaneState(name) if r is None else LaneState(r[0], r[1], codec.loads(r[2]), r[3], r[4])
        )

    def records(
        self,
        lane: str | None = None,
        *,
        run_id: str | None = None,
        since_seq: int = 0,
        types: tuple[str, ...] | None = None,
    ) -> list[dict[str, Any]]:
        sql = "SELECT id, seq, body FROM records WHERE session_id=? AND seq>?"
        args: list[Any] = [self.session_id, since_seq]
        if lane is not None:
            sql += " AND lane=?"
            args.append(lane)
        if run_id is not None:
            sql += " AND run_id=?"
            args.append(run_id)
        if types is not None:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            args.extend(types)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY seq", args).fetchall()
        return [d for r in rows if (d := self._decode("records", *r)) is not None]

    def last_seq(self) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT last_seq FROM sessions WHERE id=?", (self.session_id,)
            ).fetchone()
        return int(row[0])

    # -- writing ---------------------------------------------------------------------------
    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        if self.read_only:
            raise ReadOnlySession(f"session {self.location} is open read-only")
        if not ops:
            return self.last_seq()
        if self.durability != "batch" or not wait:
            with self._lock:
                self._begin()
                try:
                    seq = self._apply(ops, self._fence())
                    self._set_last_seq(seq)
                    self._commit_txn()
                except BaseException:
                    rollback(self._conn)
                    raise
                self._after_commit(wait)
                return seq
        item = PendingCommit(ops)
        with self._cond:
            self._queue.append(item)
            while not item.done:
                if self._leader:
                    self._cond.wait()
                    continue
                self._leader = True
                batch, self._queue = self._queue, []
                self._cond.release()
                try:
                    self._run_batch(batch)
                finally:
                    self._cond.acquire()
                    self._leader = False
                    self._cond.notify_all()
        if item.error is not None:
            raise item.error
        return item.seq

    async def commit_async(self, ops: list[Op]) -> int:
        """Commit ``ops`` and await its durability (see :meth:`SessionStore.commit_async`).

        In ``batch`` mode: group commit in one transaction. The call queues its ops and yields
        once; the first queued task to resume runs the whole queue as one transaction, with one
        fencing check, one ``last_seq`` update and one WAL fsync for all (a failing call fails
        alone: see :meth:`_run_group`). A call cancelled before its ops were taken is not
        committed; one cancelled later may have been. The transaction runs on the event loop's
        thread, as a ``sync`` commit does.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        if self.durability != "batch":
            return await super().commit_async(ops)
        if self.read_only:
            raise ReadOnlySession(f"session {self.location} is open read-only")
        if not ops:
            return self.last_seq()
        return await queued_commit(self._async_queue, ops, self._run_batch)

    def _run_batch(self, batch: list[PendingCommit]) -> None:
        with self._lock:
            if len(batch) > 1 and self._run_group(batch):
                return
            try:
                self._begin()
                seq = self._fence()  # a stale writer fails the whole group, before any insert
                for i, item in enumerate(batch):
                    self._conn.execute(f"SAVEPOINT c{i}")
                    try:
                        item.seq = seq = self._apply(item.ops, seq)
                        self._conn.execute(f"RELEASE c{i}")
                    except Exception as exc:  # one bad commit fails alone
                        self._conn.execute(f"ROLLBACK TO c{i}")
                        self._conn.execute(f"RELEASE c{i}")
                        self._txn_entries.clear()  # some of them were rolled back
                        item.error = exc
                self._set_last_seq(seq)
                self._commit_txn()
                self._after_commit(True)
            except BaseException as exc:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                for item in batch:
                    item.error = item.error or exc
            for item in batch:
                item.done = True

    def _run_group(self, batch: list[PendingCommit]) -> bool:
        """The optimistic form of :meth:`_run_batch`: the whole group in one transaction with no
        savepoints (two statements fewer per call). Returns ``False``, having rolled back, when
        a call failed; the caller then runs the group again with a savepoint per call."""
        c = self._conn
        self._begin()
        try:
            seq = self._fence()
            seqs = []
            for item in batch:
                seq = self._apply(item.ops, seq)
                seqs.append(seq)
            self._set_last_seq(seq)
            self._commit_txn()
        except StaleGeneration as exc:
            rollback(c)
            for item in batch:
                item.error, item.done = exc, True
            return True
        except Exception:
            try:
                c.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            return False
        try:
            self._after_commit(True)
        except OSError as exc:  # committed, but not known to be durable
            for item in batch:
                item.error = exc
        for item, item_seq in zip(batch, seqs, strict=True):
            item.seq, item.done = item_seq, True
        return True

    def _begin(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        self._txn_entries.clear()

    def _commit_txn(self) -> None:
        """COMMIT, then remember the entries it made: a parent among them needs no SELECT."""
        self._conn.execute("COMMIT")
        if len(self._recent_entries) > RECENT_ENTRIES:
            self._recent_entries.clear()
        self._recent_entries |= self._txn_entries

    def _after_commit(self, sync: bool) -> None:
        """After a COMMIT: fsync the WAL now (``sync``), or leave that to the next barrier."""
        if self.durability == "none":
            return
        if sync:
            self._sync_wal()
        else:
            self._unsynced = True

    def _sync_wal(self) -> None:
        """``fdatasync`` the database's WAL file: every frame SQLite has written to it is then
        on stable storage, which is what ``synchronous=FULL`` does at each commit. (SQLite
        itself syncs the WAL before a checkpoint and its header when it starts reusing it.)

        Raises:
            OSError: the fsync failed.
        """
        path = self.db_path + "-wal"
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:  # no WAL: everything is checkpointed into the database
            self._conn.execute("PRAGMA wal_checkpoint(FULL)")
            self._unsynced = False
            return
        fd = self._wal_fd
        if fd is None or os.fstat(fd).st_ino != inode:
            if fd is not None:
                os.close(fd)
            fd = self._wal_fd = os.open(path, os.O_RDONLY)
        trace = self._trace
        if trace is None:
            os.fdatasync(fd)
        else:  # power-cut tests: record the WAL end this sync covers (read before it)
            end, salt = wal_commit_end(path)
            os.fdatasync(fd)
            trace.record(end, salt=salt)
        self._unsynced = False

    def wait_durable(self) -> None:
        """Make every commit so far durable: fsync the WAL if a commit left it unsynced."""
        if self._unsynced:
            with self._lock:
                if self._unsynced:
                    self._sync_wal()

    async def wait_durable_async(self) -> None:
        """As :meth:`wait_durable`, on the event loop's thread (as a ``sync`` commit is)."""
        self.wait_durable()

    def _fence(self) -> int:
        """Inside the open transaction: check this writer's generation, return ``last_seq``.

        Raises:
            StaleGeneration: another writer took the session since this one opened it.
        """
        row = self._conn.execute(
            "SELECT generation, last_seq FROM sessions WHERE id=?", (self.session_id,)
        ).fetchone()
        if int(row[0]) != self.generation:
            raise StaleGeneration(
                f"session {self.location}: this writer holds generation {self.generation} but "
                f"the lease is now at generation {row[0]}; the append was refused",
                generation=self.generation,
                current=int(row[0]),
            )
        return int(row[1])

    def _set_last_seq(self, seq: int) -> None:
        self._conn.execute(
            "UPDATE sessions SET last_seq=?, modified=? WHERE id=?",
            (seq, now_iso(), self.session_id),
        )

    def _apply(self, ops: list[Op], seq: int) -> int:
        """Insert ``ops`` after ``seq`` inside the open transaction; return the last seq.

        Raises:
            InvalidOp: an op would read back as damage (checked before anything is inserted).
        """
        for op in ops:
            problem = op_shape_error(op)
            if problem is not None:
                raise InvalidOp(f"{self.location}: {problem}", op=type(op).__name__)
        for op in ops:
            seq += 1
            if isinstance(op, EntryOp):
                self._insert_entry(op, seq)
            elif isinstance(op, RecordOp):
                self._insert_record(op, seq)
            else:
                self._update_lane(op, seq)
        return seq

    def _decode(self, table: str, ident: str, seq: int, body: bytes) -> dict[str, Any] | None:
        """Decode a stored entry or record body; a damaged one is reported in ``damage`` (kind
        ``bad_row``, with its table, id and seq) and left out, never raised."""
        value, problem = row_problem(table, ident, seq, body)
        if problem is not None:
            item = bad_row(self.location, table, ident, seq, problem)
            with self._lock:
                if item not in self.damage:
                    self.damage.append(item)
            return None
        return value

    @property
    def damage(self) -> list[dict[str, Any]]:
        """Damage in this session (see :func:`~durable_harness.storage.base.damage`), from one
        full :meth:`scan` run on first use (so opening stays one row read), plus any damaged
        row met by a later read. ``fsck`` and recovery both read this: one scan, one answer."""
        with self._lock:
            if self._damage is None:
                self._damage = self.scan()
            return self._damage

    @damage.setter
    def damage(self, value: list[dict[str, Any]]) -> None:
        self._damage = value

    def scan(self) -> list[dict[str, Any]]:
        """Check the whole session; return its damage, raising nothing on stored content (the
        checks: :func:`~.scan.scan_session`)."""
        with self._lock:
            return scan_session(self._conn, self.session_id, self.location, self._schema)

    def _exists(self, entry_id: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM entries WHERE session_id=? AND id=?", (self.session_id, entry_id)
        ).fetchone()
        return row is not None

    def _ensure_lane(self, name: str) -> None:
        self._conn.execute(
            "INSERT OR IGNORE INTO lanes (session_id, name, config) VALUES (?, ?, '{}')",
            (self.session_id, name),
        )

    def _insert_entry(self, op: EntryOp, seq: int) -> None:
        entry = dict(op.entry)
        eid, parent = entry.get("id"), entry.get("parentId")
        if not isinstance(eid, str) or not eid:
            raise UnknownEntry("an entry needs a non-empty string id")
        if (
            parent is not None
            and parent not in self._txn_entries
            and parent not in self._recent_entries
            and not self._exists(parent)
        ):
            raise UnknownEntry(
                f"parent {parent} of entry {eid} does not exist in {self.location}", entry_id=parent
            )
        entry["seq"] = seq
        try:
            self._conn.execute(
                "INSERT INTO entries (session_id, id, seq, parent_id, type, body) "
                "VALUES (?,?,?,?,?,?)",
                (self.session_id, eid, seq, parent, str(entry.get("type", "")), codec.dumps(entry)),
            )
        except sqlite3.IntegrityError as exc:
            raise IdConflict(
                f"entry id {eid} already exists in {self.location}", entry_id=eid
            ) from exc
        self._txn_entries.add(eid)
        if op.lane is not None:  # create the lane or move its leaf: one upsert
            self._conn.execute(
                "INSERT INTO lanes (session_id, name, leaf_id, config) VALUES (?, ?, ?, '{}') "
                "ON CONFLICT (session_id, name) DO UPDATE SET leaf_id=excluded.leaf_id",
                (self.session_id, op.lane, eid),
            )

    def _insert_record(self, op: RecordOp, seq: int) -> None:
        rec = dict(op.record)
        rid = rec.get("id")
        if not isinstance(rid, str) or not rid:
            raise UnknownEntry("a record needs a non-empty string id")
        rec["seq"] = seq
        lane, run_id, rtype = rec.get("lane"), rec.get("runId"), str(rec.get("type", ""))
        try:
            self._conn.execute(
                "INSERT INTO records (session_id, id, seq, lane, run_id, type, body) "
                "VALUES (?,?,?,?,?,?,?)",
                (self.session_id, rid, seq, lane, run_id, rtype, codec.dumps(rec)),
            )
        except sqlite3.IntegrityError as exc:
            raise IdConflict(
                f"record id {rid} already exists in {self.location}", record_id=rid
            ) from exc
        if lane is not None:
            self._ensure_lane(lane)
            if rtype == "run_started":
                self._conn.execute(
                    "UPDATE lanes SET run_id=?, run_seq=? WHERE session_id=? AND name=?",
                    (run_id, seq, self.session_id, lane),
                )
            elif rtype == "run_finished":
                self._conn.execute(
                    "UPDATE lanes SET run_id=NULL, run_seq=NULL WHERE "
                    "session_id=? AND name=? AND run_id=?",
                    (self.session_id, lane, run_id),
                )

    def _update_lane(self, op: LaneOp, seq: int) -> None:
        self._ensure_lane(op.lane)
        body: dict[str, Any] = {"lane": op.lane, "seq": seq}
        if op.sets_leaf():
            body["leafId"] = op.leaf_id
        if op.config:
            body["config"] = op.config
        if self._schema >= 2:
            self._conn.execute(
                "INSERT INTO lane_ops (session_id, seq, lane, body) VALUES (?,?,?,?)",
                (self.session_id, seq, op.lane, codec.dumps(body)),
            )
        if op.sets_leaf():
            if op.leaf_id is not None and not self._exists(op.leaf_id):
                raise UnknownEntry(
                    f"leaf {op.leaf_id} does not exist in {self.location}", entry_id=op.leaf_id
                )
            self._conn.execute(
                "UPDATE lanes SET leaf_id=? WHERE session_id=? AND name=?",
                (op.leaf_id, self.session_id, op.lane),
            )
        if op.config:
            row = self._conn.execute(
                "SELECT config FROM lanes WHERE session_id=? AND name=?", (self.session_id, op.lane)
            ).fetchone()
            config = {**codec.loads(row[0]), **op.config}
            self._conn.execute(
                "UPDATE lanes SET config=? WHERE session_id=? AND name=?",
                (codec.dumps(config), self.session_id, op.lane),
            )

    def lease_holder(self) -> dict[str, Any] | None:
        if self._lease is not None:
            return self._lease.probe()
        lock = os.path.join(self.db_path + ".locks", f"{self.session_id}.lock")
        return FileLease(lock, self.location).probe()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            try:
                if not self.read_only:
                    self.wait_durable()
            finally:
                self._conn.close()
                if self._wal_fd is not None:
                    os.close(self._wal_fd)
                    self._wal_fd = None
                if self._trace is not None:
                    self._trace.close()
                    self._trace = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None
