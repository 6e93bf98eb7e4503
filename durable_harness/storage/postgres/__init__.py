"""The PostgreSQL backend: many hosts, one session store, fenced writers (``design/postgres.md``).
Needs ``psycopg`` and ``psycopg_pool``."""

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
