"""The SQLite backend: many sessions in one database file (stdlib ``sqlite3``, WAL mode).

One module per job: :mod:`.connection` (connections, :data:`MIGRATIONS`, read snapshots),
:mod:`.scan` (a stored session read back as damage), :mod:`.session` (one session: reads and
fenced commits), :mod:`.catalogue` (the store of many sessions). ``design/storage.md``,
"SQLite", describes the schema and the write path.
"""

from __future__ import annotations

from durable_harness.storage.sqlite.catalogue import SqliteStore
from durable_harness.storage.sqlite.connection import (
    MIGRATIONS,
    connect_read_only,
    schema_version,
)
from durable_harness.storage.sqlite.session import RECENT_ENTRIES, SqliteSessionStore

__all__ = [
    "MIGRATIONS",
    "RECENT_ENTRIES",
    "SqliteSessionStore",
    "SqliteStore",
    "connect_read_only",
    "schema_version",
]
