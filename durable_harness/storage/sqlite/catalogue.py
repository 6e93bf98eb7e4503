"""The catalogue of sessions in one SQLite database (:class:`SqliteStore`): creating, opening
and listing them."""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from durable_harness.errors import SessionExists, SessionNotFound, StoreNotFound
from durable_harness.storage.base import Durability, SessionStore, unreadable_error
from durable_harness.storage.lease import FileLease
from durable_harness.storage.oserrors import boundary, busy_timeout_s
from durable_harness.storage.private import make_private_dirs, private_fd, tighten_path
from durable_harness.storage.sql.catalogue import SqlStore, new_session
from durable_harness.storage.sql.session import Dialect
from durable_harness.storage.sqlite import connection
from durable_harness.storage.sqlite.connection import MIGRATIONS, migrate
from durable_harness.storage.sqlite.database import SharedDatabase, WriteStats
from durable_harness.storage.sqlite.group_commit import GroupQueues
from durable_harness.storage.sqlite.session import SqliteSessionStore

_TOP = "\U0010ffff"  # above every character: ``prefix + _TOP`` bounds the ids starting with it


class SqliteStore(SqlStore):
    """A catalogue of sessions in one SQLite database file at ``path`` (created ``0600``), whose
    sessions share its connections and group their commits.

    Raises:
        SessionUnreadable: the database file exists but cannot be read.
    """

    dialect = Dialect()

    @boundary
    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        """Open the store at ``path``; ``create`` makes the database and its folders if missing,
        ``create=False`` touches nothing that is not already there.

        Raises:
            StoreNotFound: ``create=False`` and no durable-harness store is at ``path``.
        """
        self.path = str(Path(path).expanduser())
        self.spec = f"sqlite:{self.path}"
        self._locks = self.path + ".locks"
        self._shared: SharedDatabase | None = None
        self._shared_lock = threading.Lock()
        self._queues = GroupQueues()
        self._stats = WriteStats()
        # SQLite would say only "unable to open database file". Not checked by opening and
        # closing it: closing any descriptor of the file drops every POSIX lock this process
        # holds on it, those of SQLite connections already open here too
        # (https://www.sqlite.org/howtocorrupt.html, 2.2), and another process would then take
        # itself for the last connection and delete the WAL under them.
        if os.path.exists(self.path) and not os.access(self.path, os.R_OK):
            exc = PermissionError(errno.EACCES, os.strerror(errno.EACCES), self.path)
            raise unreadable_error(self.path, exc)
        if not create:
            if self._check_exists() >= len(MIGRATIONS):
                return  # up to date: a reader writes nothing (and may lack the right to)
        else:
            make_private_dirs(os.path.dirname(self.path) or ".")
            if not os.path.exists(self.path):
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                    private_fd(fd)
                    os.close(fd)
                except FileExistsError:
                    pass
            for name in (self.path, self.path + "-wal", self.path + "-shm"):
                tighten_path(name)  # SQLite gives -wal and -shm the database file's mode
            make_private_dirs(self._locks)
        conn = connection.connect(self.path)
        try:
            migrate(conn)
        finally:
            conn.close()

    def _check_exists(self) -> int:
        """The schema version of the existing store (raises StoreNotFound)."""
        if not os.path.isfile(self.path):
            raise StoreNotFound(
                f"no such store: {self.path} does not exist (nothing was created)",
                path=self.path,
            )
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=busy_timeout_s())
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='migrations'"
            ).fetchone()
            if found is None:
                raise StoreNotFound(
                    f"no such store: {self.path} is not a durable-harness store", path=self.path
                )
            return int(
                conn.execute("SELECT COALESCE(MAX(version), 0) FROM migrations").fetchone()[0]
            )
        finally:
            conn.close()

    @property
    def stats(self) -> WriteStats:
        """Commit calls, transactions and WAL syncs of the connections open now."""
        shared = self._shared
        return shared.stats if shared is not None else self._stats

    def _session(
        self, sid: str, write: bool, durability: Durability, break_lease: bool
    ) -> SqliteSessionStore:
        """Open session ``sid`` through this object's shared connections."""
        shared = self._acquire_shared()
        return SqliteSessionStore(
            self.path,
            sid,
            read_only=not write,
            durability=durability,
            lease=self._lease(sid) if write else None,
            break_lease=break_lease,
            shared=shared,
            queues=self._queues,
        )

    def _acquire_shared(self) -> SharedDatabase:
        """This object's shared connections, counted one more user."""
        with self._shared_lock:
            shared = self._shared
            if shared is None or not shared.acquire():
                shared = self._shared = SharedDatabase(self.path)
                shared.acquire()
        return shared

    def _lease(self, sid: str) -> FileLease:
        os.makedirs(self._locks, exist_ok=True, mode=0o700)
        return FileLease(os.path.join(self._locks, f"{sid}.lock"), f"session {sid} in {self.path}")

    def _create(self, header: dict[str, Any], durability: Durability, fresh: bool) -> SessionStore:
        sid = header["id"]
        conn = connection.connect(self.path)
        try:
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's job, off this commit
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in new_session(header):
                    conn.execute(sql, args)
                conn.execute("COMMIT")
            except sqlite3.IntegrityError as exc:
                conn.execute("ROLLBACK")
                raise SessionExists(
                    f"session {sid} already exists in {self.path}", session_id=sid
                ) from exc
        finally:
            conn.close()
        return self._session(sid, True, durability, False)

    def _open(
        self, ref: str, write: bool, durability: Durability, break_lease: bool
    ) -> SessionStore:
        shared = self._acquire_shared()  # held: the lookup and the session share a connection
        try:
            return self._session(self.resolve(ref).id, write, durability, break_lease)
        finally:
            shared.release()

    @boundary
    def delete_session(self, session_id: str) -> None:
        """Delete the session's rows in one transaction under its lease, then its lock file."""
        if self.find_exact(session_id) is None:
            raise SessionNotFound(f"no session {session_id} in {self.spec}", ref=session_id)
        lease = self._lease(session_id)
        lease.acquire()
        try:
            conn = connection.connect(self.path)
            try:
                conn.execute("PRAGMA wal_autocheckpoint=0")  # as in _create
                conn.execute("BEGIN IMMEDIATE")
                for table in ("entries", "records", "lanes", "lane_ops"):
                    conn.execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))
                conn.execute("DELETE FROM sessions WHERE id=?", (session_id,))
                conn.execute("COMMIT")
            finally:
                conn.close()
            os.unlink(lease.lock_path)
        finally:
            lease.release()

    def _prefix(self, prefix: str) -> tuple[str, list[Any]]:
        """A range of the primary key: exactly the ids that start with ``prefix``."""
        return "id >= ? AND id < ?", [prefix, prefix + _TOP]

    @boundary
    def _catalogue(self, sql: str, args: Any) -> list[Any]:
        """Run one catalogue query on the shared reader connection."""
        shared = self._acquire_shared()
        try:
            with shared.read_lock:
                return shared.reader.execute(sql, args).fetchall()
        finally:
            shared.release()
