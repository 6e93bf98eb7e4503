"""Connections to the PostgreSQL store: spec parsing, one pool per database per process, and the
boundary that turns ``psycopg`` errors into typed ones (``design/postgres.md``)."""

from __future__ import annotations

import hashlib
import os
import re
import select
import socket
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
"""Seconds to wait for a connection (new or pooled) before StorageIOError."""

POOL_MAX_ENV = "DURABLE_HARNESS_PG_POOL_MAX"
DEFAULT_POOL_MAX = 8
"""Connections one process keeps to one database at most (``$DURABLE_HARNESS_PG_POOL_MAX``)."""

HELD_SPARE = 2
"""Pool connections never held past a call (:meth:`Database.hold`)."""

RECONNECT_DEADLINE_S = 30.0
"""Seconds a commit whose connection was lost retries to learn if it landed."""

RECONNECT_CHAIN_S = 1.0
"""The pool's ``reconnect_timeout``: seconds one chain of connection attempts lasts before it
gives up, so that the next request starts a new one at once (``design/host.md``, "Workers":
"Reconnecting"). ``psycopg_pool``'s default (300 s) doubles the pause between attempts (1, 2, 4,
8, 16 s...) and lets no request start another attempt meanwhile: a server back after a 15 s
outage was reached 20-27 s later."""

GETCONN_SLICE_S = 0.5
"""Seconds one wait for a pooled connection lasts before the request asks again (each ask may
start a new attempt chain), within :data:`CONNECT_TIMEOUT_S` in all."""

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
    """``spec`` without its password (``postgres://`` written ``postgresql://``): printable, and it
    reopens the store when the password comes from ``PGPASSWORD`` or ``~/.pgpass``.

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
    """The libpq parameters of ``spec`` (FormatError, never showing a password, when invalid)."""
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
    """The typed error for a ``psycopg`` error, password removed: DatabaseLocked for a lock or
    statement timeout or a deadlock, StorageIOError for anything else (``design/postgres.md``
    "Errors")."""
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


def pid_namespace() -> str:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``; ``"0"`` where unknown):
    a pid names one process only together with its host and namespace."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def backend_name(
    pid: int | None = None, host: str | None = None, namespace: str | None = None
) -> str:
    """The ``application_name`` the connections of process ``pid`` of ``host`` (default: this
    process) carry: ``durable-harness <pid> <10 hex digits of host and pid namespace>``, under
    the server's 63 bytes. A takeover of a lease whose holder died on this host waits until the
    server has no backend of that name left, so the commits the dead process had sent are run
    before the generation moves (``design/postgres.md``, "Leases and fencing")."""
    pid = os.getpid() if pid is None else pid
    place = f"{host or socket.gethostname()}:{namespace or pid_namespace()}"
    return f"durable-harness {pid} {hashlib.sha1(place.encode()).hexdigest()[:10]}"


class Database:
    """One PostgreSQL database as this process uses it: a pool of autocommit connections and the
    schema, migrated on first use; one per (process, spec), from :meth:`get`.

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
            kwargs={
                "autocommit": True,
                "connect_timeout": CONNECT_TIMEOUT_S,
                "application_name": backend_name(),
            },
            timeout=CONNECT_TIMEOUT_S,
            reconnect_timeout=RECONNECT_CHAIN_S,
            open=False,
            name=self.display,
        )

    @classmethod
    def get(cls, spec: str) -> Database:
        """The process's :class:`Database` for ``spec`` (a forked child gets its own).

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
        """Close this process's pool for ``spec`` and drop it from the cache (tests)."""
        with cls._cache_lock:
            db = cls._cache.pop((os.getpid(), spec), None)
        if db is not None and db._pool_opened:
            db.pool.close(timeout=5)

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection of its own, outside the pool."""
        return psycopg.connect(
            self.spec,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=backend_name(),
        )

    def _open_pool(self) -> None:
        if not self._pool_opened:
            with self._lock:
                if not self._pool_opened:
                    self.pool.open(wait=False)
                    self._pool_opened = True

    def getconn(self) -> psycopg.Connection[Any]:
        """A pooled connection (give it back with ``pool.putconn``), asked for in slices of
        :data:`GETCONN_SLICE_S` so that a server that came back is reached within about
        :data:`RECONNECT_CHAIN_S` + a slice, not after the pool's backoff.

        Raises:
            psycopg_pool.PoolTimeout: none within :data:`CONNECT_TIMEOUT_S`.
        """
        self._open_pool()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            try:
                return self.pool.getconn(timeout=max(0.01, min(GETCONN_SLICE_S, left)))
            except PoolTimeout:
                if left <= GETCONN_SLICE_S:
                    raise PoolTimeout(
                        f"couldn't get a connection after {CONNECT_TIMEOUT_S:.2f} sec"
                    ) from None

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection for the block (a broken one is discarded), got as
        :meth:`getconn` gets it."""
        conn = self.getconn()
        try:
            with conn:  # a pooled connection is not closed on exit (psycopg's pool rule)
                yield conn
        finally:
            self.pool.putconn(conn)

    def hold(self) -> psycopg.Connection[Any] | None:
        """A pooled connection kept past the call (an unwaited commit's; give it back with
        :meth:`unhold`), or ``None`` when fewer than :data:`HELD_SPARE` would stay for waited
        commits. psycopg_pool.PoolTimeout: none within the pool's timeout."""
        with self._lock:
            if self._held >= self.pool.max_size - HELD_SPARE:
                return None
            self._held += 1
        try:
            conn = self.getconn()
            if not _closed_by_server(conn):
                return conn
            # closed by a server restart (design/postgres.md "Unwaited commits")
            conn.close()
            self.pool.putconn(conn)
            self.pool.check()
            return self.getconn()
        except BaseException:
            with self._lock:
                self._held -= 1
            raise

    def unhold(self, conn: psycopg.Connection[Any], *, discard: bool = False) -> None:
        """Give back a :meth:`hold` connection; ``discard`` closes it (state unknown)."""
        try:
            if discard and not conn.closed:
                conn.close()
            self.pool.putconn(conn)
        finally:
            with self._lock:
                self._held -= 1

    def run(self, fn: Callable[[psycopg.Connection[Any]], T], *, idempotent: bool = True) -> T:
        """``fn(conn)`` on a pooled connection; when ``idempotent`` and the connection was broken in
        the pool, once more on a fresh one."""
        for attempt in (1, 2):
            with self.connection() as conn:
                try:
                    return fn(conn)
                except psycopg.OperationalError:
                    if attempt == 2 or not idempotent or not conn.broken:
                        raise
            # the server restarted: drop every dead idle connection now
            self.pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def run_until(self, fn: Callable[[psycopg.Connection[Any]], T], deadline: float) -> T:
        """``fn(conn)`` (idempotent) as :meth:`run`, retried every 0.2 s until ``deadline``
        (``time.monotonic()``), then psycopg.OperationalError."""
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
        """Apply the migrations this database lacks (once per process); with ``create=False`` a
        database holding no store is refused (an older store is still migrated).

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
    """``durable-harness migrate``: apply the pending migrations at ``spec``; return ``{"store",
    "applied": [versions], "version"}`` (FormatError, StorageIOError)."""
    db = Database.get(spec)
    with db.connect() as conn:
        applied = migrate(conn, db.display)
        version = db.schema_version(conn) or 0
    db._migrated = True
    return {"store": db.display, "applied": applied, "version": version}


def _closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """True when idle ``conn`` is closed or readable: the server sends an idle connection nothing
    but its goodbye, so a readable one is not trusted with a commit (one ``select``)."""
    if conn.closed:
        return True
    readable, _w, _x = select.select([conn.pgconn.socket], [], [], 0)
    return bool(readable)
