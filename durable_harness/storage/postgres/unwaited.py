"""Commits sent without waiting for their replies, and the replies read later
(``design/postgres.md``, "Unwaited commits"), through libpq's pipeline mode (:mod:`psycopg.pq`)."""

from __future__ import annotations

import select
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq

from durable_harness.errors import StorageIOError
from durable_harness.storage.base import Op
from durable_harness.storage.handoff import PendingCommit
from durable_harness.storage.postgres import write
from durable_harness.storage.postgres.connection import RECONNECT_DEADLINE_S, Database
from durable_harness.storage.postgres.lease import DbLease
from durable_harness.storage.sql.cache import WriterCache

Conn = psycopg.Connection[Any]

_PREPARED = "_dh_prepared"  # attribute on a connection: the statement names prepared on it

MAX_UNITS = 2
"""Commit units one pipeline may have unanswered: what a SIGKILL of this process keeps
(``design/postgres.md`` "Unwaited commits").
"""


@dataclass
class Unit:
    """One statement sent in a :class:`Pipeline`: the caller's ``tag``, ``done`` once its reply was
    read, ``error`` the server's refusal."""

    tag: Any
    done: bool = False
    error: psycopg.Error | None = None


@dataclass
class Pipeline:
    """A held connection (from ``Database.hold``) in pipeline mode, its ``units`` sent and unread
    (oldest first) and the ``failed`` ones read so far. Not thread-safe."""

    conn: Conn
    units: deque[Unit] = field(default_factory=deque)
    failed: list[Unit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.conn.pgconn.enter_pipeline_mode()

    def send(
        self,
        name: str,
        query: bytes,
        params: list[str | None],
        tag: Any,
    ) -> Unit:
        """Send ``query`` (``$1`` placeholders, each cast) as the prepared statement ``name`` with
        ``params`` (text format, ``None`` for ``NULL``), then ``Sync``, all bytes to the kernel;
        psycopg.OperationalError when the connection broke (the unit stays queued)."""
        pgconn = self.conn.pgconn
        encoding = self.conn.info.encoding
        dumped = [None if p is None else p.encode(encoding) for p in params]
        unit = Unit(tag)
        # queued before waiting: a connection found lost while waiting for the oldest reply
        # leaves this unit unsent and unanswered, to be resolved with the rest
        self.units.append(unit)
        if len(self.units) > MAX_UNITS:
            self._read(block=True, keep=MAX_UNITS)  # until the oldest reply is read
        prepared: set[str] = getattr(self.conn, _PREPARED, set())
        key = name.encode()
        if name not in prepared:
            pgconn.send_prepare(key, query)
            prepared.add(name)
            setattr(self.conn, _PREPARED, prepared)
        pgconn.send_query_prepared(key, dumped)
        pgconn.pipeline_sync()  # queues Sync and flushes what it can
        while pgconn.flush():
            # the server may be blocked writing replies to us: read them while we wait
            readable, _w, _x = select.select([pgconn.socket], [pgconn.socket], [])
            if readable:
                self._read(block=False)
        return unit

    def usable(self) -> bool:
        """Read the replies that arrived, without waiting; ``False`` when something else came:
        the goodbye of a server that closed the connection (a restart's), an error before a
        reply, the connection's end."""
        sock = self.conn.pgconn.socket
        if not select.select([sock], [], [], 0)[0]:
            return True
        try:
            self._read(block=False)
        except psycopg.OperationalError:
            return False
        if self.conn.broken or any(u.error is not None for u in self.units):
            return False
        return bool(self.units) or not select.select([sock], [], [], 0)[0]

    def read_all(self) -> None:
        """Wait for the reply of every unit sent (psycopg.OperationalError: lost first)."""
        self._read(block=True)

    def close(self) -> None:
        """Leave pipeline mode (raises psycopg.OperationalError with replies unread)."""
        self.conn.pgconn.exit_pipeline_mode()

    def _read(self, *, block: bool, keep: int = 0) -> None:
        """Read replies until at most ``keep`` are unanswered, or (not ``block``) none arrived."""
        pgconn = self.conn.pgconn
        encoding = self.conn.info.encoding
        while len(self.units) > keep:
            pgconn.consume_input()
            nulls = 0
            while len(self.units) > keep and not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:  # the end of one statement's results
                    nulls += 1
                    if nulls > 1:
                        break
                    continue
                nulls = 0
                unit = self.units[0]
                status = result.status
                if status == pq.ExecStatus.PIPELINE_SYNC:
                    unit.done = True
                    self.units.popleft()
                    if unit.error is not None:
                        self.failed.append(unit)
                elif status == pq.ExecStatus.FATAL_ERROR and unit.error is None:
                    unit.error = psycopg.errors.error_from_result(result, encoding=encoding)
                    if unit.error.sqlstate == "26000":  # the statement was never prepared
                        getattr(self.conn, _PREPARED, set()).clear()
            if len(self.units) <= keep or not block:
                return
            select.select([pgconn.socket], [], [])


class UnwaitedCommits:
    """The unwaited commits of one
    :class:`~durable_harness.storage.postgres.store.PostgresSessionStore` (a part of it)."""

    db: Database
    session_id: str
    location: str
    lease: DbLease | None
    generation: int
    _pipe: Pipeline | None
    _cache: WriterCache

    @property
    def writer_lost(self) -> bool:
        """True when this writer was fenced out (every later commit is refused)."""
        return self.lease is not None and self.lease.lost

    # the store's own, used here
    _run_batch: Callable[[list[PendingCommit]], None]
    _after: Callable[[list[PendingCommit]], None]
    _head: Callable[[BaseException, float], int]
    _commit_params: Callable[[list[Op], int], list[str | None]]
    _stale: Callable[[int], Exception]

    def _send_unwaited(self, item: PendingCommit) -> bool:
        """Send ``item`` on the pipeline, unanswered; ``False`` (nothing sent): take the waited
        path."""
        pipe = self._pipe
        # Whatever arrived is read first: a connection the server closed while it was held (a
        # restart) is given up before a commit is sent to it, which a SIGKILL after the call
        # returned would lose (as hold() does for a pooled one).
        if pipe is not None and (pipe.failed or pipe.conn.broken or not pipe.usable()):
            self._settle()
            pipe = None
        if self.lease is None or not self._cache.ok or self.writer_lost:
            self._settle()
            return False
        start = self._cache.last_seq
        params = self._commit_params(item.ops, start)
        if pipe is None:
            conn = self.db.hold()
            if conn is None:
                return False
            pipe = self._pipe = Pipeline(conn)
        item.seq = start + len(item.ops)
        try:
            pipe.send("dh_write", write.WRITE_PIPELINED, params, (item, start))
        except psycopg.OperationalError:
            pass  # whether it got there is for _settle to learn, as for a reply lost
        item.done = True
        self._after([item])
        return True

    def _settle(self) -> None:
        """Read every reply and give the connection back (``_lock`` held); raise the first unwaited
        commit's failure or redo what did not land (``design/postgres.md`` "Unwaited commits")."""
        pipe, self._pipe = self._pipe, None
        if pipe is None:
            return
        sent = list(pipe.units)
        lost: psycopg.OperationalError | None = None
        try:
            pipe.read_all()
            pipe.close()
        except psycopg.OperationalError as exc:
            lost = exc
        self.db.unhold(pipe.conn, discard=lost is not None)
        units = sorted(
            {id(u): u for u in [*pipe.failed, *sent]}.values(), key=lambda u: u.tag[0].seq
        )
        bad = next((i for i, u in enumerate(units) if u.error is not None or not u.done), None)
        if bad is None:  # every commit landed
            return
        self._cache.drop()
        rest: list[PendingCommit] = [u.tag[0] for u in units[bad:]]
        first = units[bad]
        if first.error is None or isinstance(first.error, psycopg.OperationalError):
            # lost before its reply (or the server said it was going away): learn what landed
            last_seq = self._landed(rest, first.tag[1], lost or OSError("connection lost"))
            rest = [item for item in rest if item.seq > last_seq]
        elif not write.resend_cures(first.error):
            raise self._refusal(first.error, rest[0].ops) from None
        for item in rest:
            item.done, item.error, item.seq = False, None, 0
            self._run_batch([item])
            if item.error is not None:
                raise item.error

    def _landed(self, items: list[PendingCommit], start: int, lost: BaseException) -> int:
        """After a lost connection: the ``last_seq`` the unread ``items`` reached (StorageIOError
        if none)."""
        last_seq = self._head(lost, time.monotonic() + RECONNECT_DEADLINE_S)
        if last_seq < start:
            raise StorageIOError(
                f"{self.location}: the server lost commits it had run (last_seq went back "
                f"from {start} to {last_seq}: it restarted without their WAL, which only "
                "durability 'none' allows); reopen the session",
                path=self.location,
                cause=str(lost),
            )
        if last_seq != start and last_seq not in {item.seq for item in items}:
            raise StorageIOError(
                f"{self.location}: the connection was lost with commits in flight and "
                f"last_seq moved from {start} to {last_seq}, not to the end of one of them; "
                "reopen the session",
                path=self.location,
                cause=str(lost),
            )
        return last_seq

    def _refusal(self, exc: psycopg.Error, ops: list[Op]) -> Exception:
        """The typed error for a commit the server refused (:func:`.write.refusal`)."""
        return write.refusal(exc, ops, self.session_id, self.location, self._stale)

    def _drop_pipe(self) -> None:
        """Give up the pipeline's replies unread (its connection is closed)."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            self.db.unhold(pipe.conn, discard=True)
