"""Commits sent without waiting for their replies, and the replies read later
(``design/postgres.md``, "Unwaited commits").

``commit(wait=False)`` on PostgreSQL hands the statement's bytes to the kernel and returns: the
server runs it while the harness goes on, and the replies are read by the session's next call
that must know them (the barrier, a read, a waited commit). A :class:`Pipeline` holds one
pooled connection in libpq's pipeline mode, so several commits can be on the way at once.
Each is sent as its own unit, the statement followed by ``Sync``, so the server commits it as
soon as its bytes arrive, whether or not this process is still alive to read the reply: a
SIGKILL after :meth:`Pipeline.send` returned keeps the commit, as a SIGKILL after a file
backend's ``write`` does. A unit the server refuses does not stop the units after it; the
store's fence (each commit names the ``last_seq`` it follows) refuses those.

Parameters arrive already in PostgreSQL's text input format (:mod:`.write`). Only the
documented layer of psycopg below its cursors is used: the libpq calls of :mod:`psycopg.pq`
(``PQenterPipelineMode``, ``PQsendPrepare``, ``PQsendQueryPrepared``, ``PQpipelineSync``,
``PQconsumeInput``, ``PQgetResult``) on the connection's ``pgconn``, which psycopg keeps in
non-blocking mode.
"""

from __future__ import annotations

import select
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq

Conn = psycopg.Connection[Any]

_PREPARED = "_dh_prepared"  # attribute on a connection: the statement names prepared on it

MAX_UNITS = 2
"""Commit units one pipeline may have unanswered; a send past it first waits for the oldest
reply. Two is what a SIGKILL of this process keeps: the server runs the first unit and writes
its reply to the dead client (that write succeeds; the client's kernel answers it with a
reset), runs and commits the second and fails to write that reply, and then drops the
connection at its next interrupt check, so a third would be rolled back. Measured in
``tests/storage/test_postgres_pipeline.py``. A barrier's unit may go behind them
(``behind=True``): losing it loses nothing, since the barrier has not returned."""


@dataclass
class Unit:
    """One statement sent in a :class:`Pipeline`, and what its reply said once read.

    Attributes:
        tag: the caller's (the store keeps its commit and ``last_seq`` before it there).
        done: the reply was read.
        error: the server's refusal, when it refused.
    """

    tag: Any
    done: bool = False
    error: psycopg.Error | None = None


@dataclass
class Pipeline:
    """A held connection in pipeline mode and the units sent on it whose replies are unread,
    oldest first. Not thread-safe: its owner serialises calls.

    Attributes:
        conn: the connection (from ``Database.hold``).
        units: the units sent and not yet read (:meth:`read_all` empties it).
        failed: the units read so far that the server refused, oldest first.
    """

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
        *,
        behind: bool = False,
    ) -> Unit:
        """Send ``query`` (``$1``-style placeholders, every one cast in the query) as the
        prepared statement ``name`` (prepared on this connection the first time) with
        ``params`` (each in PostgreSQL's text input format, ``None`` for ``NULL``), then
        ``Sync``; return once every byte is with the kernel.

        Raises:
            psycopg.OperationalError: the connection broke while sending (whether the server
                got the whole unit is then unknown; the unit is queued all the same).
        """
        pgconn = self.conn.pgconn
        encoding = self.conn.info.encoding
        dumped = [None if p is None else p.encode(encoding) for p in params]
        unit = Unit(tag)
        # queued before waiting: a connection found lost while waiting for the oldest reply
        # leaves this unit unsent and unanswered, to be resolved with the rest
        self.units.append(unit)
        if len(self.units) > MAX_UNITS and not behind:
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

    def read_all(self) -> None:
        """Wait for the reply of every unit sent (the queue is then empty and the connection
        can leave pipeline mode).

        Raises:
            psycopg.OperationalError: the connection was lost before every reply arrived (the
                units whose replies were read have ``done`` set).
        """
        self._read(block=True)

    def close(self) -> None:
        """Leave pipeline mode (every reply read).

        Raises:
            psycopg.OperationalError: replies are still unread.
        """
        self.conn.pgconn.exit_pipeline_mode()

    def _read(self, *, block: bool, keep: int = 0) -> None:
        """Read replies until at most ``keep`` units are unanswered (``block``) or until none
        that has arrived is left (not ``block``)."""
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
