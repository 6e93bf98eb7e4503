"""The catalogue of sessions in one SQLite database (:class:`SqliteStore`): creating, opening
and listing them."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from durable_harness.errors import SessionExists, SessionNotFound, StoreNotFound
from durable_harness.ids import now_iso, uuid7
from durable_harness.storage import codec
from durable_harness.storage.base import (
    CwdMatcher,
    Durability,
    SessionInfo,
    SessionStore,
    Store,
    new_header,
    unreadable_error,
)
from durable_harness.storage.lease import FileLease
from durable_harness.storage.oserrors import busy_timeout_s
from durable_harness.storage.private import make_private_dirs, private_fd, tighten_path
from durable_harness.storage.rows import session_info
from durable_harness.storage.sqlite import connection
from durable_harness.storage.sqlite.connection import MIGRATIONS, migrate
from durable_harness.storage.sqlite.database import SharedDatabase, WriteStats
from durable_harness.storage.sqlite.group_commit import GroupQueues
from durable_harness.storage.sqlite.session import SqliteSessionStore

_INFO = "SELECT id, cwd, created, modified, parent_session FROM sessions"
_TOP = "\U0010ffff"  # above every character: ``prefix + _TOP`` bounds the ids starting with it


class SqliteStore(Store):
    """A catalogue of sessions in one SQLite database file at ``path`` (created ``0600``).

    The sessions opened through one object share its connections and group their commits
    (:mod:`.database`, :mod:`.group_commit`); :attr:`stats` counts what they did.

    Raises:
        SessionUnreadable: the database file exists but cannot be read.
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        """Open the store at ``path``; with ``create`` (the default) make the database, its
        folder and its lock folder if missing. ``create=False`` (read-only commands) touches
        nothing on disk that is not already there.

        Raises:
            StoreNotFound: ``create=False`` and no database is at ``path``, or the file there
                is not a durable-harness store.
        """
        self.path = str(Path(path).expanduser())
        self.spec = f"sqlite:{self.path}"
        self._locks = self.path + ".locks"
        self._shared: SharedDatabase | None = None
        self._shared_lock = threading.Lock()
        self._queues = GroupQueues()
        self._stats = WriteStats()
        if os.path.exists(self.path):
            try:  # SQLite would say only "unable to open database file"
                os.close(os.open(self.path, os.O_RDONLY))
            except OSError as exc:
                raise unreadable_error(self.path, exc) from exc
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
        """For ``create=False``: the database must exist and hold our ``migrations`` table;
        return its schema version."""
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
        """Commit calls, transactions and WAL syncs of this object's sessions (of the
        connections open now: counting restarts after every session was closed)."""
        shared = self._shared
        return shared.stats if shared is not None else self._stats

    def _open(
        self, sid: str, *, write: bool, durability: Durability, break_lease: bool
    ) -> SessionStore:
        """Open session ``sid`` through this object's shared connections (opened when none
        is open)."""
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
        """This object's shared connections, counted one more user (the caller releases
        them, or hands them to a session that does); opened when none are open."""
        with self._shared_lock:
            shared = self._shared
            if shared is None or not shared.acquire():
                shared = self._shared = SharedDatabase(self.path)
                shared.acquire()
        return shared

    def _lease(self, sid: str) -> FileLease:
        os.makedirs(self._locks, exist_ok=True, mode=0o700)
        return FileLease(os.path.join(self._locks, f"{sid}.lock"), f"session {sid} in {self.path}")

    def create_session(
        self,
        cwd: str,
        *,
        session_id: str | None = None,
        parent_session: str | None = None,
        header_extra: dict[str, Any] | None = None,
        durability: Durability = "sync",
    ) -> SessionStore:
        sid = session_id or uuid7()
        ts = now_iso()
        header = new_header(sid, ts, cwd, parent_session, header_extra)
        conn = connection.connect(self.path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT INTO sessions (id, cwd, created, modified, header, "
                    "parent_session) VALUES (?,?,?,?,?,?)",
                    (sid, cwd, ts, ts, codec.dumps(header), parent_session),
                )
                conn.execute(
                    "INSERT INTO lanes (session_id, name, config) VALUES (?, 'main', '{}')", (sid,)
                )
                conn.execute("COMMIT")
            except sqlite3.IntegrityError as exc:
                conn.execute("ROLLBACK")
                raise SessionExists(
                    f"session {sid} already exists in {self.path}", session_id=sid
                ) from exc
        finally:
            conn.close()
        return self._open(sid, write=True, durability=durability, break_lease=False)

    def open_session(
        self,
        ref: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> SessionStore:
        shared = self._acquire_shared()  # held: the lookup and the session share a connection
        try:
            sid = self.resolve(ref).id
            return self._open(sid, write=write, durability=durability, break_lease=break_lease)
        finally:
            shared.release()

    def delete_session(self, session_id: str) -> None:
        """Delete the session's rows (entries, records, lanes, lane ops, the session row) in
        one transaction under its writer lease, then its lock file (see
        :meth:`Store.delete_session`)."""
        if self.find_exact(session_id) is None:
            raise SessionNotFound(f"no session {session_id} in {self.spec}", ref=session_id)
        lease = self._lease(session_id)
        lease.acquire()
        try:
            conn = connection.connect(self.path)
            try:
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

    def find_exact(self, session_id: str) -> SessionInfo | None:
        """The session row of ``session_id`` by its primary key (see :meth:`Store.find_exact`);
        ``None``: no such id (the lookup is exact and complete)."""
        return next(iter(self._rows(f"{_INFO} WHERE id = ?", (session_id,))), None)

    def find_prefixed(self, prefix: str) -> list[SessionInfo]:
        """The rows whose id starts with ``prefix``, read by a range of the primary key
        (``BINARY`` order: exactly the ids that start with it), at most 50."""
        return self._rows(
            f"{_INFO} WHERE id >= ? AND id < ? ORDER BY id LIMIT 50",
            (prefix, prefix + _TOP),
        )

    def _rows(self, sql: str, params: tuple[str, ...]) -> list[SessionInfo]:
        """Run one catalogue query on the shared reader connection (the sessions' own, when
        any is open: no connection of its own is opened or kept for a lookup)."""
        shared = self._acquire_shared()
        try:
            with shared.read_lock:
                rows = shared.reader.execute(sql, params).fetchall()
        finally:
            shared.release()
        return [self._info(r) for r in rows]

    def _info(self, r: tuple[Any, ...]) -> SessionInfo:
        return session_info(self.spec, r)

    def list_sessions(self, cwd: str | None = None) -> list[SessionInfo]:
        """Every session of the database (of one cwd by :class:`CwdMatcher`: the recorded cwd,
        as real paths), most recently modified first. Each distinct recorded cwd is resolved
        once; the rows are then read through the ``(cwd, modified)`` index."""
        conn = connection.connect(self.path)
        try:
            sql = _INFO
            if cwd is None:
                rows = conn.execute(sql + " ORDER BY modified DESC").fetchall()
            else:
                match = CwdMatcher(cwd)
                spellings = [
                    r[0] for r in conn.execute("SELECT DISTINCT cwd FROM sessions") if match(r[0])
                ]
                rows = []
                for i in range(0, len(spellings), 500):  # under SQLite's bound-parameter limit
                    part = spellings[i : i + 500]
                    marks = ",".join("?" * len(part))
                    rows += conn.execute(sql + f" WHERE cwd IN ({marks})", part).fetchall()
                rows.sort(key=lambda r: r[3], reverse=True)
        finally:
            conn.close()
        return [self._info(r) for r in rows]
