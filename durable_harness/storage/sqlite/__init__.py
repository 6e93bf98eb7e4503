"""The SQLite backend: many sessions in one database file (stdlib ``sqlite3``, WAL mode;
``design/storage.md`` "SQLite"), over the SQL core (``storage/sql``)."""

from __future__ import annotations

from durable_harness.storage.sqlite.catalogue import SqliteStore
from durable_harness.storage.sqlite.connection import (
    MIGRATIONS,
    connect_read_only,
    schema_version,
)
from durable_harness.storage.sqlite.session import SqliteSessionStore

__all__ = [
    "MIGRATIONS",
    "SqliteSessionStore",
    "SqliteStore",
    "connect_read_only",
    "schema_version",
]
