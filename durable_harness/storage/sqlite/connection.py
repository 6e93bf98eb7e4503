"""The SQLite database itself: connections, the schema as an ordered list of migrations (an old one
never edited), and read snapshots."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

from durable_harness.errors import NotAStore
from durable_harness.ids import now_iso
from durable_harness.storage.oserrors import busy_timeout_s

MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY, cwd TEXT NOT NULL, created TEXT NOT NULL, modified TEXT NOT NULL,
        header BLOB NOT NULL, last_seq INTEGER NOT NULL DEFAULT 0,
        generation INTEGER NOT NULL DEFAULT 0, name TEXT, parent_session TEXT);
    CREATE INDEX sessions_cwd ON sessions (cwd, modified);
    CREATE TABLE entries (
        session_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, parent_id TEXT,
        type TEXT NOT NULL, body BLOB NOT NULL, PRIMARY KEY (session_id, id)) WITHOUT ROWID;
    CREATE UNIQUE INDEX entries_seq ON entries (session_id, seq);
    CREATE TABLE records (
        session_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, lane TEXT,
        run_id TEXT, type TEXT NOT NULL, body BLOB NOT NULL, PRIMARY KEY (session_id, id))
        WITHOUT ROWID;
    CREATE UNIQUE INDEX records_seq ON records (session_id, seq);
    CREATE INDEX records_lane ON records (session_id, lane, seq);
    CREATE TABLE lanes (
        session_id TEXT NOT NULL, name TEXT NOT NULL, leaf_id TEXT, config BLOB NOT NULL,
        run_id TEXT, run_seq INTEGER, PRIMARY KEY (session_id, name)) WITHOUT ROWID;
    """,
    # 2: a lane op gets a row of its own, so a deleted row shows as a gap below ``last_seq``;
    # ``checked_from``: where continuity checking starts (``design/storage.md``)
    """
    CREATE TABLE lane_ops (
        session_id TEXT NOT NULL, seq INTEGER NOT NULL, lane TEXT NOT NULL, body BLOB NOT NULL,
        PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
    ALTER TABLE sessions ADD COLUMN checked_from INTEGER NOT NULL DEFAULT 0;
    UPDATE sessions SET checked_from = last_seq;
    """,
    # 3: the cwd index without ``modified``, which every commit moves: with it in the index each
    # commit wrote one more page to the WAL; the catalogue reads the index for cwds only and
    # sorts in Python (design/storage.md, "Where a turn's WAL frames go")
    """
    DROP INDEX sessions_cwd;
    CREATE INDEX sessions_cwd ON sessions (cwd);
    """,
]


PAGE_SIZE = 1024
"""Bytes per page of a database this module creates (SQLite's default: 4,096). A commit writes
whole pages to the WAL, one for each B-tree it touches (about 14 a turn's commit), and the WAL
``fdatasync`` that makes it durable takes longer the more bytes it carries: 1 KiB pages write 2.7x
fewer WAL bytes a turn than 4 KiB ones (``design/storage.md``, "Page size"). A database that
already exists keeps the page size it was made with (a WAL database cannot change it)."""


def connect(path: str, synchronous: str = "FULL") -> sqlite3.Connection:
    """A read-write autocommit connection to ``path``, usable from any thread, WAL mode, ``PRAGMA
    synchronous`` as given, the busy timeout of :func:`~..oserrors.busy_timeout_s`; a database it
    creates gets pages of :data:`PAGE_SIZE` bytes.

    Raises:
        sqlite3.Error: the database cannot be opened or switched to WAL.
    """
    timeout = busy_timeout_s()
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    # before the switch to WAL, which writes the first page of a new file; on a database that
    # exists SQLite ignores it
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    _set_wal(conn, timeout)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=OFF")
    return conn


def _set_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """``PRAGMA journal_mode=WAL``, retried for ``timeout`` s (``design/storage.md`` "SQLite")."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite did not already; a failing ROLLBACK is ignored."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that can change nothing (``mode=ro``), for ``fsck``.

    Raises:
        NotAStore: ``path`` is a readable SQLite database without the durable-harness tables.
        sqlite3.Error: ``path`` cannot be read as a SQLite database (damaged, or not one).
    """
    conn = sqlite3.connect(
        f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except BaseException:
        conn.close()
        raise
    if not {"sessions", "entries", "records", "lanes"} <= tables:
        conn.close()
        raise NotAStore(f"{path} is a SQLite database, but not a durable-harness store", path=path)
    return conn


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest migration applied to the database (0 before the first)."""
    try:
        return int(conn.execute("SELECT COALESCE(MAX(version), 0) FROM migrations").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def migrate(conn: sqlite3.Connection) -> None:
    """Apply each migration past the database's version in one transaction with its version row."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, applied TEXT NOT NULL)"
    )
    done = conn.execute("SELECT COALESCE(MAX(version), 0) FROM migrations").fetchone()[0]
    for version, script in enumerate(MIGRATIONS, start=1):
        if version <= done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT 1 FROM migrations WHERE version=?", (version,)).fetchone():
                conn.execute("ROLLBACK")
                continue
            for stmt in script.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute("INSERT INTO migrations VALUES (?, ?)", (version, now_iso()))
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise


@contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """Run the block's reads in one read transaction (or the one already open)."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
