"""The catalogue of a PostgreSQL store (:class:`PostgresStore`): sessions of one database."""

from __future__ import annotations

import os
import socket
from typing import Any

import psycopg
import psycopg.errors

from durable_harness.errors import SessionExists, SessionNotFound
from durable_harness.storage.base import Durability, SessionStore
from durable_harness.storage.oserrors import boundary
from durable_harness.storage.postgres.connection import Database, redact_dsn
from durable_harness.storage.postgres.lease import (
    DbLease,
    held_error,
    lease_seconds,
    live_holder,
    owner_token,
)
from durable_harness.storage.postgres.store import PostgresSessionStore
from durable_harness.storage.sql.catalogue import SqlStore, new_session
from durable_harness.storage.sql.session import PostgresDialect


class PostgresStore(SqlStore):
    """Sessions in one PostgreSQL database (``spec``: a ``postgresql://`` URL).

    Attributes:
        spec: the URL as given (it may hold a password: print :attr:`location` instead).
        location: the server as ``postgresql://user@host:port/dbname`` (no password).
        lease_s: the writer lease duration in seconds (``design/postgres.md``).
    """

    dialect = PostgresDialect()

    @boundary
    def __init__(self, spec: str, *, create: bool = True, lease_s: float | None = None) -> None:
        """Open the store; apply pending migrations (once per process).

        Raises:
            FormatError: ``spec`` is not a valid PostgreSQL URL.
            StoreNotFound: ``create=False`` and the database holds no durable-harness store.
            StorageIOError: the server cannot be reached (named without the password).
        """
        self.spec = spec
        self.location = redact_dsn(spec)  # until the server is known (errors name it)
        self.db = Database.get(spec)
        self.location = self.db.display
        self.lease_s = lease_seconds(lease_s)
        self.db.ensure_schema(create=create)

    def _lease(self, sid: str) -> DbLease:
        return DbLease(self.db, sid, f"session {sid} in {self.location}", self.lease_s)

    def _create(self, header: dict[str, Any], durability: Durability, fresh: bool) -> SessionStore:
        sid = header["id"]

        def insert(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                for sql, args in new_session(header):
                    conn.execute(self.dialect.sql(sql), args)
                conn.execute("INSERT INTO leases (session_id) VALUES (%s)", (sid,))

        try:
            self.db.run(insert, idempotent=False)
        except psycopg.errors.UniqueViolation as exc:
            raise SessionExists(
                f"session {sid} already exists in {self.location}", session_id=sid
            ) from exc
        return PostgresSessionStore(
            self.db, sid, read_only=False, durability=durability, lease=self._lease(sid)
        )

    def _open(
        self, ref: str, write: bool, durability: Durability, break_lease: bool
    ) -> SessionStore:
        sid = self.resolve(ref).id
        lease = self._lease(sid) if write else None
        return PostgresSessionStore(
            self.db,
            sid,
            read_only=not write,
            durability=durability,
            lease=lease,
            break_lease=break_lease,
        )

    def where(self) -> str:
        """The server as ``postgresql://user@host:port/dbname``: never the password."""
        return self.location

    @boundary
    def _catalogue(self, sql: str, args: Any) -> list[Any]:
        return self.db.run(lambda c: c.execute(sql, args).fetchall())

    def _prefix(self, prefix: str) -> tuple[str, list[Any]]:
        """``LIKE``, its wildcards escaped (the collation may not order ids byte-wise)."""
        return "id LIKE %s", [
            prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        ]

    @boundary
    def delete_session(self, session_id: str) -> None:
        """Delete one session and every row of it, in one transaction with the lease row locked.

        Raises:
            SessionNotFound: no session has this id.
            LeaseHeld: a live writer holds it.
        """

        def delete(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                row = conn.execute(
                    "SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (session_id,)
                ).fetchone()
                if row is None:
                    raise SessionNotFound(
                        f"no session {session_id} in {self.location}", session_id=session_id
                    )
                conn.execute("SELECT 1 FROM leases WHERE session_id = %s FOR UPDATE", (session_id,))
                holder = live_holder(conn, session_id)
                if holder is not None:
                    raise held_error(f"session {session_id} in {self.location}", holder)
                conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))

        self.db.run(delete, idempotent=False)

    @boundary
    def claim_expired(
        self, limit: int = 10, *, durability: Durability = "sync"
    ) -> list[SessionStore]:
        """Take over up to ``limit`` sessions whose lease is held but expired (their writer died),
        oldest expiry first, in one ``FOR UPDATE SKIP LOCKED`` statement; each comes back open
        for writing at the next generation (``design/postgres.md`` "Worker claims").

        Raises:
            StorageIOError: the server cannot be reached.
        """
        prefix = owner_token().rsplit(":", 1)[0] + ":"

        def claim(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            with conn.transaction():
                return conn.execute(
                    "WITH c AS (SELECT session_id FROM leases WHERE owner IS NOT NULL AND "
                    "expires < clock_timestamp() ORDER BY expires LIMIT %s "
                    "FOR UPDATE SKIP LOCKED) "
                    "UPDATE leases l SET generation = l.generation + 1, "
                    "owner = %s || substr(md5(random()::text || l.session_id), 1, 16), "
                    "host = %s, pid = %s, acquired = clock_timestamp(), broken = FALSE, "
                    "expires = clock_timestamp() + make_interval(secs => %s) "
                    "FROM c WHERE l.session_id = c.session_id "
                    "RETURNING l.session_id, l.generation, l.owner",
                    (limit, prefix, socket.gethostname(), os.getpid(), self.lease_s),
                ).fetchall()

        out: list[SessionStore] = []
        for sid, generation, owner in self.db.run(claim, idempotent=False):
            lease = self._lease(str(sid))
            lease.adopt(int(generation), str(owner))
            try:
                out.append(
                    PostgresSessionStore(
                        self.db, str(sid), read_only=False, durability=durability, lease=lease
                    )
                )
            except BaseException:
                lease.release()
                raise
        return out
