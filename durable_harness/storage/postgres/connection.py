"""Connections to the PostgreSQL store: spec parsing, one pool per database per process, and
the boundary that turns ``psycopg`` errors into typed ones.

A spec is a libpq URL, ``postgresql://[user[:password]@]host[:port]/dbname[?param=value...]``
(``postgres://`` is accepted too; every libpq parameter works, ``options=-csearch_path=NAME``
puts the store in its own schema). A password in the spec works but is never shown: every
message, location and listing names the server as :func:`describe` prints it
(``postgresql://user@host:port/dbname``). Prefer ``PGPASSWORD`` or ``~/.pgpass``.

Schema changes are in :mod:`.migrations`. See ``design/postgres.md``.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from durable_harness.errors import (
    DatabaseLocked,
    FormatError,
    StorageError,
    StorageIOError,
    StoreNotFound,
)
from durable_harness.storage.oserrors import register_family
from durable_harness.storage.postgres.migrations import MIGRATIONS, check_not_newer, migrate

SCHEMES = ("postgresql://", "postgres://")

CONNECT_TIMEOUT_S = 10
"""Seconds to wait for a connection (a new one, or a free one from the pool) before the call
fails with :class:`~durable_harness.errors.StorageIOError` naming the server."""

POOL_MAX_ENV = "DURABLE_HARNESS_PG_POOL_MAX"
DEFAULT_POOL_MAX = 8
"""Connections one process keeps to one database at most (``$DURABLE_HARNESS_PG_POOL_MAX``)."""

HELD_SPARE = 2
"""Pool connections never held past a call (:meth:`Database.hold`): with the default pool, six
sessions at a time may have an unwaited commit in flight."""

RECONNECT_DEADLINE_S = 30.0
"""How long a commit whose connection was lost keeps trying to reach the server again to learn
whether the commit landed (see :meth:`Database.connection`)."""

_PASSWORD_IN_URL = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@")
_PASSWORD_PARAM = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.I)


def is_postgres_spec(spec: str) -> bool:
    """True when ``spec`` names a PostgreSQL store (``postgresql://`` or ``postgres://``)."""
    return spec.startswith(SCHEMES)


def redact_dsn(text: str) -> str:
    """``text`` with any password in a libpq URL or ``password=`` parameter replaced by
    ``***``."""
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", text))


def describe(spec: str) -> str:
    """``spec`` without its password: the printable name of the store, and a URL that reopens
    it wherever the password comes from ``PGPASSWORD`` or ``~/.pgpass`` (every other parameter
    is kept; ``postgres://`` is written ``postgresql://``).

    Raises:
        FormatError: ``spec`` is not a valid libpq URL.
    """
    parse(spec)
    text = "postgresql://" + spec.split("://", 1)[1]
    text = re.sub(r"^(postgresql://[^:/@?]*):[^@/?]*@", r"\1@", text)
    base, _sep, query = text.partition("?")
    kept = [p for p in query.split("&") if p and not p.lower().startswith("password=")]
    return base + ("?" + "&".join(kept) if kept else "")


def parse(spec: str) -> dict[str, str]:
    """The libpq parameters of ``spec`` (``postgres://`` read as ``postgresql://``).

    Raises:
        FormatError: ``spec`` is not a valid libpq URL (the message never shows a password).
    """
    if not is_postgres_spec(spec):
        raise FormatError(f"store spec {redact_dsn(spec)!r} is not a postgresql:// URL")
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(spec).items() if v is not None}
    except psycopg.Error as exc:
        raise FormatError(
            f"store spec {redact_dsn(spec)!r} is not a valid PostgreSQL URL: {redact_dsn(str(exc))}"
        ) from None
    port = params.get("port", "")
    if port and not all(p.strip().isdigit() for p in port.split(",")):
        raise FormatError(f"store spec {redact_dsn(spec)!r}: port {port!r} is not a number")
    return params


def translate_psycopg(exc: BaseException, where: str | None) -> BaseException:
    """The typed error for a ``psycopg`` error (registered with the storage boundary,
    :func:`~durable_harness.storage.oserrors.register_family`).

    * a lost or refused connection, a pool that found no connection in time, a server
      shutting down: :class:`~durable_harness.errors.StorageIOError` naming the server;
    * a lock or statement timeout, a deadlock: :class:`~durable_harness.errors.DatabaseLocked`;
    * anything else: :class:`~durable_harness.errors.StorageIOError` with the server's text.

    Passwords are removed from every message.
    """
    server = redact_dsn(where or "PostgreSQL server")
    text = redact_dsn(str(exc)).strip() or type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(
        exc,
        psycopg.errors.LockNotAvailable
        | psycopg.errors.DeadlockDetected
        | psycopg.errors.QueryCanceled,
    ):
        return DatabaseLocked(
            f"{server}: {text}; retry once the other connection has finished",
            path=server,
            sqlstate=sqlstate,
        )
    if isinstance(exc, PoolTimeout):
        cause = f"no connection to the server within {CONNECT_TIMEOUT_S} s ({text})"
        return StorageIOError(f"{server}: {cause}", path=server, errno="ETIMEDOUT", cause=cause)
    if isinstance(exc, psycopg.OperationalError):
        cause = f"connection to the PostgreSQL server failed or was lost: {text}"
        return StorageIOError(
            f"{server}: {cause}", path=server, errno="ECONNRESET", cause=cause, sqlstate=sqlstate
        )
    return StorageIOError(
        f"{server}: database error: {text}", path=server, errno=sqlstate, cause=text
    )


register_family(psycopg.Error, translate_psycopg)


T = TypeVar("T")


class Database:
    """One PostgreSQL database as this process uses it: a connection pool (autocommit
    connections; writes open explicit transactions) and the schema, migrated on first use.

    Get one with :meth:`get`: one object per (process, spec), shared by every store object
    opened on the same spec, so reopening a store opens no new connections.

    Attributes:
        spec: the libpq URL as given (may hold a password: never print it).
        display: the server as :func:`describe` names it (printable).
    """

    _cache: ClassVar[dict[tuple[int, str], Database]] = {}
    _cache_lock = threading.Lock()

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.display = describe(spec)
        self._params = parse(spec)
        self._migrated = False
        self._pool_opened = False
        self._held = 0  # connections out through hold()
        self._lock = threading.Lock()
        self.heartbeat: Any = None  # set by storage/postgres/lease.py (one per database)
        try:
            pool_max = int(os.environ.get(POOL_MAX_ENV) or DEFAULT_POOL_MAX)
        except ValueError:
            raise StorageError(
                f"{POOL_MAX_ENV}={os.environ.get(POOL_MAX_ENV)!r} is not a whole number",
                env=POOL_MAX_ENV,
            ) from None
        self.pool = ConnectionPool(
            spec,
            min_size=0,
            max_size=max(1, pool_max),
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
            timeout=CONNECT_TIMEOUT_S,
            open=False,
            name=self.display,
        )

    @classmethod
    def get(cls, spec: str) -> Database:
        """The process's :class:`Database` for ``spec`` (made on first use; a forked child gets
        its own, never its parent's connections).

        Raises:
            FormatError: ``spec`` is not a valid libpq URL.
        """
        key = (os.getpid(), spec)
        with cls._cache_lock:
            db = cls._cache.get(key)
            if db is None:
                db = cls._cache[key] = cls(spec)
            return db

    @classmethod
    def forget(cls, spec: str) -> None:
        """Close this process's pool for ``spec`` and drop it from the cache (tests, which
        make a schema per test; stores still open on it fail afterwards)."""
        with cls._cache_lock:
            db = cls._cache.pop((os.getpid(), spec), None)
        if db is not None and db._pool_opened:
            db.pool.close(timeout=5)

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection of its own (not from the pool), autocommit.

        Raises:
            psycopg.OperationalError: the server cannot be reached (translated by the boundary).
        """
        return psycopg.connect(self.spec, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)

    def _open_pool(self) -> None:
        if not self._pool_opened:
            with self._lock:
                if not self._pool_opened:
                    self.pool.open(wait=False)
                    self._pool_opened = True

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection for the block. A connection found broken when it is
        returned (the server restarted, the network dropped) is discarded by the pool."""
        self._open_pool()
        with self.pool.connection() as conn:
            yield conn

    def hold(self) -> psycopg.Connection[Any] | None:
        """A pooled connection kept past the call that took it (an unwaited commit's, until its
        reply is read), or ``None`` when :data:`HELD_SPARE` connections would no longer stay
        for everyone else. Those spare connections are what makes holding safe: a caller
        that cannot hold commits the waited way on one of them, so a process whose sessions
        hold connections across an event loop's turns never waits on itself. Give it back
        with :meth:`unhold`.

        Raises:
            psycopg_pool.PoolTimeout: no connection within the pool's timeout.
        """
        with self._lock:
            if self._held >= self.pool.max_size - HELD_SPARE:
                return None
            self._held += 1
        try:
            self._open_pool()
            conn = self.pool.getconn()
            if not _closed_by_server(conn):
                return conn
            # a server restart closed the pooled connections: a commit sent on one would
            # reach no server, and a SIGKILL before its reply is read would lose it
            conn.close()
            self.pool.putconn(conn)
            self.pool.check()
            return self.pool.getconn()
        except BaseException:
            with self._lock:
                self._held -= 1
            raise

    def unhold(self, conn: psycopg.Connection[Any], *, discard: bool = False) -> None:
        """Give back a connection from :meth:`hold`; with ``discard`` (its state is unknown:
        a reply not read, a broken link) it is closed rather than reused."""
        try:
            if discard and not conn.closed:
                conn.close()
            self.pool.putconn(conn)
        finally:
            with self._lock:
                self._held -= 1

    def run(self, fn: Callable[[psycopg.Connection[Any]], T], *, idempotent: bool = True) -> T:
        """``fn(conn)`` on a pooled connection. When ``idempotent`` (reads) and the connection
        turns out broken (a server restart closed it while it sat in the pool), ``fn`` runs once
        more on a fresh connection; the second failure is raised."""
        for attempt in (1, 2):
            with self.connection() as conn:
                try:
                    return fn(conn)
                except psycopg.OperationalError:
                    if attempt == 2 or not idempotent or not conn.broken:
                        raise
            # the server restarted: the other idle connections are dead too; test them all
            # now (the dead are dropped) rather than meet them one failure at a time
            self.pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def run_until(self, fn: Callable[[psycopg.Connection[Any]], T], deadline: float) -> T:
        """``fn(conn)`` (idempotent) as :meth:`run`, tried again every 0.2 s while the server
        cannot be reached, until ``deadline`` (a ``time.monotonic()`` value): what a writer
        uses to learn the outcome of a commit whose connection was lost, or to redo a barrier.

        Raises:
            psycopg.OperationalError: the server was still unreachable at ``deadline``.
        """
        while True:
            try:
                return self.run(fn, idempotent=True)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def schema_version(self, conn: psycopg.Connection[Any]) -> int | None:
        """The highest migration applied (``None`` when there is no ``migrations`` table)."""
        found = conn.execute("SELECT to_regclass('migrations') IS NOT NULL").fetchone()
        if not found or not found[0]:
            return None
        row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM migrations").fetchone()
        return int(row[0]) if row else 0

    def ensure_schema(self, *, create: bool) -> None:
        """Apply the migrations this database lacks (once per process), or with ``create=False``
        only check that it is a durable-harness store (a store behind the current schema is
        still migrated: an upgrade must not need a separate step before reading).

        Raises:
            StoreNotFound: ``create=False`` and the database holds no durable-harness store.
            StorageError: the database was migrated by a newer durable-harness.
            StorageIOError: the server cannot be reached.
        """
        if self._migrated:
            return
        with self._lock:
            if self._migrated:
                return
            with self.connect() as conn:
                version = self.schema_version(conn)
                if version is None and not create:
                    raise StoreNotFound(
                        f"no such store: {self.display} holds no durable-harness tables "
                        "(nothing was created)",
                        path=self.display,
                    )
                if version is None or version < len(MIGRATIONS):
                    migrate(conn, self.display)
                else:
                    check_not_newer(version, self.display)
            self._migrated = True


def migrate_spec(spec: str) -> dict[str, Any]:
    """``durable-harness migrate``: apply the pending migrations of the store at ``spec``;
    return ``{"store", "applied": [versions], "version"}``.

    Raises:
        FormatError: not a PostgreSQL URL. StorageIOError: the server cannot be reached.
    """
    db = Database.get(spec)
    with db.connect() as conn:
        applied = migrate(conn, db.display)
        version = db.schema_version(conn) or 0
    db._migrated = True
    return {"store": db.display, "applied": applied, "version": version}


def _closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """True when ``conn``, idle in the pool, is closed or has something to read: the server
    sends an idle connection nothing but its goodbye (a restart's or an administrator's
    ``terminating connection``, then the end) short of a rare spontaneous notice, so a
    readable one is not trusted with a commit that must reach the server. One non-blocking
    ``select``, no round trip."""
    if conn.closed:
        return True
    readable, _w, _x = select.select([conn.pgconn.socket], [], [], 0)
    return bool(readable)
