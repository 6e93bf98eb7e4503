"""What the sessions opened through one :class:`~.catalogue.SqliteStore` object share: a reader and
a writer connection, and the WAL's durability tickets (``design/storage.md`` "SQLite")."""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import suppress
from dataclasses import dataclass

from durable_harness.storage import timing
from durable_harness.storage.barrier_trace import (
    WAL_FRAME_HEADER,
    WAL_HEADER,
    BarrierTrace,
    open_trace,
    wal_commit_end,
)
from durable_harness.storage.handoff import SyncHandoff
from durable_harness.storage.oserrors import busy_timeout_s
from durable_harness.storage.sqlite import connection
from durable_harness.storage.sqlite.checkpoint import Checkpointer
from durable_harness.storage.sqlite.connection import schema_version

WRITER_CACHE_KIB = 65_536
"""Page cache of the shared writer connection (``design/storage.md`` "SQLite")."""

WAL_PREFILL_MIN = 256 * 1024
WAL_PREFILL_MAX = 4 * 1024 * 1024
"""Bytes of zeros written past the ``-wal`` file's end once SQLite's frames come within
:data:`WAL_PREFILL_MARGIN` of it: the file's size, in this range (``design/storage.md``, "The
prefilled WAL")."""
WAL_PREFILL_MARGIN = 64 * 1024
"""Bytes before the ``-wal`` file's end where a frame of the current log calls for a prefill
(about four turns' commits on 1 KiB pages)."""


@dataclass
class WriteStats:
    """Counters of one :class:`SharedDatabase`: ``commits`` (calls), ``transactions`` (COMMITs on
    the writer), ``wal_syncs`` (``fdatasync`` of the ``-wal`` file)."""

    commits: int = 0
    transactions: int = 0
    wal_syncs: int = 0


class SharedDatabase:
    """The connections and WAL bookkeeping of one database, counted by :meth:`acquire` /
    :meth:`release` (the last release closes them). ``lock`` serialises the writer, ``read_lock``
    the reader; neither is held during a WAL sync.

    Raises:
        sqlite3.Error: the database cannot be opened.
    """

    def __init__(self, path: str, reader: sqlite3.Connection | None = None) -> None:
        self.path = path
        self.wal_path = path + "-wal"
        self.lock = threading.RLock()
        self.read_lock = threading.RLock()
        self.reader = reader if reader is not None else connection.connect(path, "NORMAL")
        try:
            self.schema = schema_version(self.reader)
        except BaseException:
            self.reader.close()
            raise
        self._writer: sqlite3.Connection | None = None
        self.stats = WriteStats()
        self.committed = 0  # ticket of the last COMMIT on the writer
        self.handoff = SyncHandoff()  # every ticket up to ``handoff.synced`` is durable
        self._wal_fd: int | None = None
        self._trace: BarrierTrace | None = None  # power-cut tests only (barrier_trace.py)
        self.checkpointer: Checkpointer | None = None  # with the writer (checkpoint.py)
        self._users = 0
        self._users_lock = threading.Lock()
        self.closed = False

    # -- lifetime --------------------------------------------------------------------------
    def acquire(self) -> bool:
        """Count one more session; ``False`` when already closed (make a new one)."""
        with self._users_lock:
            if self.closed:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        """One session stopped using this database; the last one closes it."""
        with self._users_lock:
            self._users -= 1
            if self._users > 0 or self.closed:
                return
            self.closed = True
        if self.checkpointer is not None:  # before the last connections close
            self.checkpointer.close()
        with self.lock, self.read_lock:
            try:
                self.reader.close()
                if self._writer is not None:
                    self._writer.close()
            finally:
                self._writer = None
                if self._wal_fd is not None:
                    os.close(self._wal_fd)
                    self._wal_fd = None
                if self._trace is not None:
                    self._trace.close()
                    self._trace = None

    @property
    def writer(self) -> sqlite3.Connection:
        """The writer connection (``synchronous=NORMAL``), opened on first use; hold
        :attr:`lock`."""
        conn = self._writer
        if conn is None:
            with self.lock:
                conn = self._writer
                if conn is None:
                    conn = connection.connect(self.path, "NORMAL")
                    conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
                    conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's job
                    self.checkpointer = Checkpointer(self.path)
                    self._writer = conn
                    self._trace = open_trace(self.path)
                    if self._trace is not None:  # the trace starts here: the WAL found is durable
                        end, salt = wal_commit_end(self.wal_path)
                        self._trace.record(end, salt=salt)
        return conn

    # -- durability ------------------------------------------------------------------------
    def note_commit(self, calls: int) -> int:
        """After a COMMIT of ``calls`` calls on the writer (``lock`` held): its ticket."""
        self.committed += 1
        self.stats.transactions += 1
        self.stats.commits += calls
        checkpointer = self.checkpointer
        if checkpointer is not None:
            checkpointer.note_commit()
            if checkpointer.finish_due:  # copy what came during the thread's run
                result: tuple[int, int, int] | None
                try:
                    (result,) = self.writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # committed either way; the next COMMIT tries again
                    result = None
                checkpointer.finished(result)
        return self.committed

    def sync_to(self, ticket: int) -> None:
        """Return once every commit up to ``ticket`` is durable (one caller syncs for all it
        covers).

        Raises:
            OSError: the sync failed (the commits it was to cover are not known durable).
        """

        def sync() -> int:
            covered = self.committed
            self._sync_wal()
            return covered

        self.handoff.sync_to(ticket, sync)

    @property
    def synced(self) -> int:
        """Every ticket up to this one is durable."""
        return self.handoff.synced

    def _sync_wal(self) -> None:
        """``fdatasync`` the ``-wal`` file (what ``synchronous=FULL`` does at each commit),
        zeros written past its end first when SQLite's frames come near it
        (:meth:`_prefill_wal`)."""
        try:
            inode = os.stat(self.wal_path).st_ino
        except FileNotFoundError:  # no WAL: everything is checkpointed into the database
            with self.lock:
                self.writer.execute("PRAGMA wal_checkpoint(FULL)")
            return
        fd = self._wal_fd
        if fd is None or os.fstat(fd).st_ino != inode:
            if fd is not None:
                os.close(fd)
            fd = self._wal_fd = os.open(self.wal_path, os.O_RDWR)
        if _frames_near_end(fd):
            self._prefill_wal(fd)
        trace = self._trace
        end, salt = wal_commit_end(self.wal_path) if trace is not None else (0, "")
        started = timing.start()
        os.fdatasync(fd)
        timing.since("fsync", started)
        self.stats.wal_syncs += 1
        if trace is not None:  # power-cut tests: the WAL end this sync covered (read before it)
            trace.record(end, salt=salt)

    def _prefill_wal(self, fd: int) -> None:
        """Write zeros past the end of the ``-wal`` file ``fd`` (as many bytes as it holds,
        within :data:`WAL_PREFILL_MIN` .. :data:`WAL_PREFILL_MAX`), so the frames of the
        commits that follow overwrite blocks the file has: their ``fdatasync`` then has no new
        size or blocks to journal (``design/storage.md``, "The prefilled WAL"). Under SQLite's write
        lock (an empty ``BEGIN IMMEDIATE``, not waited for: a busy database is prefilled at a
        later sync), so no connection of any process is writing frames past the end meanwhile;
        nor is the writer's Python lock waited for (a thread holding it may be waiting for
        SQLite's lock, and the commit this sync is for would be acknowledged that much later);
        SQLite ignores the zeros (a frame without the header's salts ends the log). Nothing is
        written while this thread's writer is inside a transaction, or on any error (the sync
        goes on; the next one tries again)."""
        writer = self._writer
        if writer is None or not self.lock.acquire(blocking=False):
            return  # another thread is writing (maybe waiting for SQLite): a later sync
        try:
            if writer.in_transaction:
                return
            try:
                writer.execute("PRAGMA busy_timeout=0")
                writer.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                return
            finally:
                with suppress(sqlite3.Error):
                    writer.execute(f"PRAGMA busy_timeout={int(busy_timeout_s() * 1000)}")
            try:
                if _frames_near_end(fd):  # still: no other process prefilled meanwhile
                    size = os.fstat(fd).st_size
                    os.pwrite(fd, bytes(min(max(size, WAL_PREFILL_MIN), WAL_PREFILL_MAX)), size)
            except OSError:
                return
            finally:
                with suppress(sqlite3.Error):
                    writer.execute("ROLLBACK")
        finally:
            self.lock.release()


def _frames_near_end(fd: int) -> bool:
    """True when the ``-wal`` file ``fd`` holds a frame of its current log (the header's salts,
    https://www.sqlite.org/walformat.html) in its last :data:`WAL_PREFILL_MARGIN` bytes, or is
    shorter than that margin: the next commits would grow it. Zeros of a prefill, or frames of
    a log before the WAL started again, do not count. ``False`` before SQLite wrote a header."""
    header = os.pread(fd, WAL_HEADER, 0)
    if len(header) < WAL_HEADER:
        return False
    frame = WAL_FRAME_HEADER + int.from_bytes(header[8:12], "big")
    slot = (os.fstat(fd).st_size - WAL_HEADER - WAL_PREFILL_MARGIN) // frame
    if slot < 0:
        return True
    return os.pread(fd, WAL_FRAME_HEADER, WAL_HEADER + slot * frame)[8:16] == header[16:24]
