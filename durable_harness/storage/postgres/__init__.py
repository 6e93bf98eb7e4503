"""The PostgreSQL backend: many hosts, one session store, fenced writers (``design/postgres.md``).

Modules: :mod:`.connection` (spec parsing, the per-process pool, the error boundary),
:mod:`.migrations` (the versioned schema), :mod:`.lease` (lease rows and the heartbeat),
:mod:`.store` (one session, :class:`PostgresSessionStore`), :mod:`.write` (the statements a
writer sends), :mod:`.unwaited` (commits answered later), :mod:`.catalogue`
(:class:`PostgresStore`). Importing this package
needs ``psycopg`` and ``psycopg_pool`` (dependencies of durable-harness).
"""

from __future__ import annotations

from durable_harness.storage.postgres.catalogue import PostgresStore
from durable_harness.storage.postgres.connection import (
    describe,
    is_postgres_spec,
    migrate_spec,
    redact_dsn,
)
from durable_harness.storage.postgres.lease import DbLease
from durable_harness.storage.postgres.migrations import MIGRATIONS
from durable_harness.storage.postgres.store import PostgresSessionStore

__all__ = [
    "MIGRATIONS",
    "DbLease",
    "PostgresSessionStore",
    "PostgresStore",
    "describe",
    "is_postgres_spec",
    "migrate_spec",
    "redact_dsn",
]
