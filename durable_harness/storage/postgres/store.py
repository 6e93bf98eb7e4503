"""One session in PostgreSQL, opened through
:class:`~durable_harness.storage.postgres.catalogue.PostgresStore`: the SQL core's reads,
answered from the writer's cache where it can; one ``dh_write`` statement per commit
(``design/postgres.md`` "Commit")."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import psycopg.errors

from durable_harness.errors import (
    IdConflict,
    InvalidOp,
    ReadOnlySession,
    SessionNotFound,
    StaleGeneration,
    StorageError,
    StorageIOError,
    UnknownEntry,
)
from durable_harness.storage import codec
from durable_harness.storage.base import Durability, LaneState, Op
from durable_harness.storage.fold import number
from durable_harness.storage.handoff import GroupLeader, PendingCommit, TaskQueue
from durable_harness.storage.oserrors import boundary
from durable_harness.storage.postgres import unwaited, write
from durable_harness.storage.postgres.connection import RECONNECT_DEADLINE_S, Database
from durable_harness.storage.postgres.lease import DbLease
from durable_harness.storage.postgres.unwaited import UnwaitedCommits
from durable_harness.storage.sql.cache import WriterCache
from durable_harness.storage.sql.session import LANES, PostgresDialect, SqlSessionStore, lane_row

Conn = psycopg.Connection[Any]
RECENT_BODIES = 4096
"""Entry bodies a writer keeps in its cache (those it committed or read)."""

_HEADER = "SELECT header FROM sessions WHERE id = %s"
_USER_ERRORS = (IdConflict, UnknownEntry, InvalidOp)
"""Errors of one call whose transaction was rolled back: the writer's cache stays right."""


class PostgresSessionStore(UnwaitedCommits, SqlSessionStore):
    """One session of a PostgreSQL store (``db``: the shared :class:`Database`; ``lease``: ``None``
    when read-only). Thread-safe; not bound to an event loop."""

    dialect = PostgresDialect()

    @boundary
    def __init__(
        self,
        db: Database,
        session_id: str,
        *,
        read_only: bool,
        durability: Durability,
        lease: DbLease | None,
        break_lease: bool = False,
    ) -> None:
        """Open ``session_id``; with a ``lease``, take it (generation bumped).

        Raises:
            SessionNotFound: no such session.
            LeaseHeld: a live writer holds it and ``break_lease`` is False.
        """
        self.db = db
        self.session_id = session_id
        self.read_only = read_only
        self.durability = durability
        self.location = f"{db.display}#{session_id}"
        self.lease = lease
        self._lock = threading.RLock()
        self._threads: GroupLeader[PendingCommit] = GroupLeader()
        self._tasks: TaskQueue[PendingCommit] = TaskQueue()
        self._damage: list[dict[str, Any]] | None = None
        self._closed = False
        self._txn_start = -1
        # the writer's cache (valid while it holds the lease), reloaded after any doubt
        self._cache = WriterCache(RECENT_BODIES)
        self._pipe: unwaited.Pipeline | None = None  # unwaited commits whose replies are unread
        row = db.run(lambda c: c.execute(_HEADER, (session_id,)).fetchone())
        if row is None:
            raise SessionNotFound(f"no session {session_id} in {db.display}", session_id=session_id)
        self.header = codec.loads(bytes(row[0]))
        self.generation = 0
        if lease is not None:
            # a lease claimed by the catalogue (claim_expired) is already held
            self.generation = lease.generation or lease.acquire(break_lease=break_lease)
            self.db.run(self._load_state)

    def _load_state(self, conn: Conn) -> None:
        """(Writer) read ``last_seq`` and every lane into the writer's cache."""
        row = conn.execute(
            "SELECT last_seq FROM sessions WHERE id = %s", (self.session_id,)
        ).fetchone()
        if row is None:
            raise SessionNotFound(
                f"session {self.location} was deleted", session_id=self.session_id
            )
        lanes = conn.execute(self.dialect.sql(LANES), (self.session_id,)).fetchall()
        self._cache.load(int(row[0]), (lane_row(r) for r in lanes))

    @boundary
    def _cached(self) -> bool:
        """True when reads may be answered from the writer's cache."""
        if self.read_only or self.lease is None:
            return False
        if not self._cache.ok:
            with self._lock:
                self._settle()
                if not self._cache.ok:
                    self.db.run(self._load_state)
        return True

    def _after(self, batch: list[PendingCommit]) -> None:
        """Fold the committed items into the writer's cache; drop it on doubt."""
        if any(
            item.error is not None and not isinstance(item.error, _USER_ERRORS) for item in batch
        ):
            self._cache.drop()
            return
        for item in sorted(batch, key=lambda i: i.seq):
            if item.error is None:
                self._cache.fold(number(item.ops, item.seq - len(item.ops)))

    # -- reading (the queries: storage/sql/session.py; the writer's cache first) ---------
    @boundary
    def _rows(self, sql: str, args: Any) -> list[Any]:
        if self._pipe is not None:
            with self._lock:
                self._settle()
        return self.db.run(lambda c: c.execute(sql, args).fetchall())

    @boundary
    def _snapshot(self, queries: list[str]) -> list[list[Any]]:
        """One ``REPEATABLE READ`` transaction (unwaited commits settled first)."""

        def read(conn: Conn) -> list[list[Any]]:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                return [conn.execute(q, (self.session_id,)).fetchall() for q in queries]

        with self._lock:
            self._settle()
        return self.db.run(read)

    def _scan_queries(self) -> list[str]:
        """Every seq is checked (the schema has no ``checked_from``)."""
        head, *rest = super()._scan_queries()
        return [head.replace("checked_from", "0"), *rest]

    def get_entry(self, entry_id: str) -> dict[str, Any] | None:
        cached = self._cached()
        if cached:
            with self._lock:
                kept = self._cache.entry(entry_id)
            if kept is not None:
                return kept
        got = super().get_entry(entry_id)
        if cached and got is not None:
            with self._lock:
                self._cache.remember(entry_id, codec.dumps(got))
        return got

    def lanes(self) -> dict[str, LaneState]:
        if not self._cached():
            return super().lanes()
        with self._lock:  # a commit folding into the cache must not be seen halfway
            return self._cache.all_lanes()

    def lane(self, name: str) -> LaneState:
        if not self._cached():
            return super().lane(name)
        with self._lock:
            return self._cache.lane(name)

    def lane_leaf(self, name: str) -> str | None:
        if not self._cached():
            return super().lane(name).leaf_id
        with self._lock:
            return self._cache.leaf(name)

    def last_seq(self) -> int:
        return self._cache.last_seq if self._cached() else super().last_seq()

    @boundary
    def lease_holder(self) -> dict[str, Any] | None:
        """The live holder of the writer lease (``{"pid", "host", "generation", "owner", "expires",
        "broken", "self"}``), or ``None``."""
        probe = self.lease or DbLease(self.db, self.session_id, self.location, 1.0)
        return probe.probe()

    # -- writing ---------------------------------------------------------------------------
    @boundary
    def commit(self, ops: list[Op], *, wait: bool = True) -> int:
        """Commit ``ops`` in one transaction, whose COMMIT waits for the WAL flush (not in
        ``none``); with ``wait=False`` the call does not wait for the reply, which
        :meth:`wait_durable` reads (``design/postgres.md`` "Durability").

        Raises:
            as :meth:`SessionStore.commit`; StorageIOError: the server could not be reached again.
        """
        if self.read_only:
            raise ReadOnlySession(f"session {self.location} is open read-only")
        if not ops:
            return self.last_seq()
        self._check_shapes(ops)
        item = PendingCommit(ops)
        if self.durability != "batch" or not wait:
            with self._lock:
                if wait or not self._send_unwaited(item):
                    self._run_batch([item])
        else:
            return self._threads.commit(item, self._run_locked)
        if item.error is not None:
            raise item.error
        return item.seq

    def _run_locked(self, batch: list[PendingCommit]) -> None:
        with self._lock:
            self._run_batch(batch)

    @boundary
    async def commit_async(self, ops: list[Op]) -> int:
        """Commit ``ops``; in ``batch`` mode one event loop's calls share one transaction."""
        if self.durability != "batch":
            return await super().commit_async(ops)
        if self.read_only:
            raise ReadOnlySession(f"session {self.location} is open read-only")
        if not ops:
            return self.last_seq()
        self._check_shapes(ops)
        return await self._tasks.commit(PendingCommit(ops), self._run_locked)

    def _commit_batch(self, batch: list[PendingCommit]) -> None:
        """Commit ``batch`` in one transaction; resolve a lost connection."""
        deadline = time.monotonic() + RECONNECT_DEADLINE_S
        while True:
            self._txn_start = -1
            lost: BaseException | None = None
            try:
                with self.db.connection() as conn:
                    try:
                        self._transaction(conn, batch)
                        return
                    except psycopg.OperationalError as exc:
                        if not conn.broken:
                            raise
                        lost = exc
            except BaseException as exc:
                if lost is None:
                    for item in batch:
                        item.error, item.done = item.error or exc, True
                    return
            if self._resolve(batch, self._txn_start, lost, deadline):
                return

    def _run_batch(self, batch: list[PendingCommit]) -> None:
        """Settle the pipeline, :meth:`_commit_batch`, update the cache."""
        try:
            self._settle()
        except BaseException as exc:
            for item in batch:
                item.error, item.done = exc, True
            return
        try:
            self._commit_batch(batch)
        finally:
            self._after(batch)

    def _resolve(
        self, batch: list[PendingCommit], start: int, lost: BaseException, deadline: float
    ) -> bool:
        """After a lost connection: whether the group landed, from ``last_seq``; ``False`` to
        rerun."""
        try:
            last_seq = self._head(lost, deadline)
        except StorageError as exc:
            for item in batch:
                item.error, item.done = exc, True
            return True
        want = [item for item in batch if not item.done]
        if start >= 0 and want and last_seq == want[-1].seq and last_seq > start:
            return True  # it landed: the COMMIT was durable before the reply was lost
        for item in want:
            item.error, item.seq = None, 0
        if start < 0 or last_seq == start:
            return False  # nothing landed: run the group again
        err2 = StorageIOError(
            f"{self.location}: the connection was lost during a commit and last_seq moved "
            f"from {start} to {last_seq}, not to the commit's end; reopen the session",
            path=self.location,
            cause=str(lost),
        )
        for item in want:
            item.error, item.done = err2, True
        return True

    def _head(self, lost: BaseException, deadline: float) -> int:
        """The stored ``last_seq`` on a new connection after ``lost`` (raises as the fence does)."""
        try:
            row = self.db.run_until(
                lambda c: c.execute(
                    "SELECT s.last_seq, l.generation FROM sessions s JOIN leases l ON "
                    "l.session_id = s.id WHERE s.id = %s",
                    (self.session_id,),
                ).fetchone(),
                deadline,
            )
        except psycopg.OperationalError as exc:
            raise StorageIOError(
                f"{self.location}: the connection was lost during a commit and the "
                f"server could not be reached again within {RECONNECT_DEADLINE_S:g} s, "
                f"so whether the commit landed is unknown ({exc}); reopen the session "
                "to see",
                path=self.location,
                errno="ECONNRESET",
                outcome="unknown",
                cause=str(lost),
            ) from None
        if row is None:
            raise SessionNotFound(
                f"session {self.location} was deleted", session_id=self.session_id
            )
        if int(row[1]) != self.generation:
            raise self._stale(int(row[1]))
        return int(row[0])

    def _stale(self, current: int) -> StaleGeneration:
        """The error of a fence that found generation ``current``."""
        if self.lease is not None:
            self.lease.lost = True
        return StaleGeneration(
            f"session {self.location}: this writer holds generation {self.generation} but the "
            f"lease is now at generation {current}; the commit was refused",
            generation=self.generation,
            current=current,
        )

    def _transaction(self, conn: Conn, batch: list[PendingCommit]) -> None:
        """Run ``batch`` in one transaction, ``_txn_start`` its starting ``last_seq``: one
        ``dh_write``, or one savepoint per call when a group fails (so the bad call fails alone)."""
        pending = [item for item in batch if not item.done]
        for attempt in (1, 2):
            if not self._cache.ok:
                self._load_state(conn)
            try:
                self._fast(conn, pending)
                break
            except write.StaleState:  # the cache was behind the database: reload it once
                self._cache.ok = False
                if attempt == 2:
                    raise StorageError(
                        f"{self.location}: last_seq moved under this writer's lease twice; "
                        "reopen the session",
                        path=self.location,
                    ) from None
            except (psycopg.OperationalError, StaleGeneration, SessionNotFound):
                raise
            except Exception:
                if len(pending) == 1:
                    raise
                for item in pending:
                    item.seq = 0
                self._stepwise(conn, pending)
                break
        for item in pending:
            item.done = True

    def _fast(self, conn: Conn, pending: list[PendingCommit]) -> None:
        """Every item in one ``dh_write`` statement; any failure fails all."""
        ops = [op for item in pending for op in item.ops]
        seq = self._txn_start = self._cache.last_seq
        for item in pending:
            seq += len(item.ops)
            item.seq = seq
        try:
            self._send(conn, ops, self._txn_start)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            raise self._refusal(exc, ops) from exc

    def _send(self, conn: Conn, ops: list[Op], last_seq: int) -> None:
        """One ``SELECT dh_write(...)`` for ``ops`` after ``last_seq``."""
        conn.execute(write.WRITE, self._commit_params(ops, last_seq))

    def _commit_params(self, ops: list[Op], last_seq: int) -> list[str | None]:
        """The parameters of ``dh_write`` for ``ops`` after ``last_seq``."""
        return write.write_params(
            self.session_id,
            self.generation,
            last_seq,
            self.durability != "none",
            ops,
            self._cache.lanes,
        )

    def _stepwise(self, conn: Conn, pending: list[PendingCommit]) -> None:
        """Every item in one transaction, each in its own savepoint."""
        seq = self._txn_start = self._cache.last_seq
        with conn.transaction():
            for item in pending:
                try:
                    with conn.transaction():  # a savepoint
                        self._send(conn, item.ops, seq)
                    item.seq = seq = seq + len(item.ops)
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as exc:
                    item.error, item.done = self._refusal(exc, item.ops), True
                except Exception as exc:
                    item.error, item.done = exc, True

    @boundary
    def wait_durable(self) -> None:
        """Make every commit so far durable: read the replies of the unwaited ones (each COMMIT
        waited for its WAL flush on the server), raising the first refusal or sending again
        what did not land (``design/postgres.md`` "Unwaited commits"). No statement of its own.
        """
        if self._pipe is None:
            return
        with self._lock:
            self._settle()

    @boundary
    async def wait_durable_async(self) -> None:
        """As :meth:`wait_durable`, on the event loop's thread."""
        self.wait_durable()

    @boundary
    def close(self) -> None:
        """Make earlier commits durable and release the lease. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.read_only:
                self.wait_durable()
        finally:
            lease, self.lease = self.lease, None
            if lease is not None:
                lease.release()

    @boundary
    def hand_back(self, *, flush: bool = False) -> None:
        """Stop writing and mark the lease expired (not released), so the next claim takes it at
        once; ``flush`` makes earlier commits durable first. Never raises; idempotent
        (``design/postgres.md`` "Worker claims")."""
        if self._closed:
            return
        self._closed = True
        if flush and not self.writer_lost:
            try:
                self.wait_durable()
            except Exception:  # the lease runs out; unwaited commits are the barrier's doubt
                pass
        with self._lock:
            self._drop_pipe()
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.expire()
