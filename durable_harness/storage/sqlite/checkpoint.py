"""WAL checkpoints off the commit path: a thread of the store's own copies the WAL back into the
database once it holds :data:`WAL_CHECKPOINT_PAGES`, so no commit waits for one
(``design/storage.md``, "SQLite", "Checkpoints").

SQLite's automatic checkpoint runs inside the COMMIT that crosses its threshold, on the
committing connection: with many sessions in one host, one commit in a few hundred took 150-230
ms (copying thousands of pages and fsyncing the database file) on the event loop's thread. Here
the shared writer runs with ``wal_autocheckpoint=0`` and :class:`Checkpointer` runs ``PRAGMA
wal_checkpoint(PASSIVE)`` on a connection of its own: passive, it never blocks the writer or a
reader (it copies what no reader still needs and stops), and sqlite3 releases the GIL while it
runs. SQLite syncs the WAL before it copies a frame and the database after, so the store's
durability (its own ``fdatasync`` of the WAL) is unchanged.

SQLite starts the WAL again from its beginning (so the file stops growing) only when a write
transaction begins with every frame copied, which a checkpoint running beside busy writers
never sees: the frames written meanwhile remain. So once the thread has copied the bulk (a
second pass for what came during the first), the writer copies the rest itself, right after
its next COMMIT (:meth:`Checkpointer.finish_due`): the few hundred pages written during the
thread's passes, not the thousands before.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import time

from durable_harness.storage.sqlite import connection

WAL_CHECKPOINT_PAGES = 10_000
"""WAL pages after which the checkpointer runs (SQLite's automatic default: 1,000). Commits of
different sessions share few pages (a group of 200 turn commits writes about 1,400), so a low
threshold copies nearly every group, and a checkpoint copies each page once however often the WAL
holds it."""

CHECK_EVERY = 32
"""Commits between two looks at the WAL's frame counts (one 100-byte read of ``-shm``)."""

PASSES = 3
"""Passive checkpoints the thread runs in a row while the frames left after one exceed
:data:`LEFT_FOR_WRITER`."""

LEFT_FOR_WRITER = 1_000
"""Frames the thread leaves for the writer's own finishing checkpoint."""

FINISH_TRIES = 8
"""COMMITs after which the writer stops trying a finishing checkpoint that finds the WAL busy."""

_MX_FRAME, _N_BACKFILL = 16, 96  # offsets in the wal-index (https://www.sqlite.org/walformat.html)

log = logging.getLogger("durable_harness.storage")


class Checkpointer:
    """The checkpoint thread of one database at ``path`` (started on first need); ``pages`` is
    the WAL size in pages that calls for a checkpoint. :meth:`note_commit` is called after
    each COMMIT on the writer, :meth:`close` once, before the writer closes.

    Attributes:
        checkpoints: checkpoints run. seconds: their total duration (s). failures: checkpoints
            that raised (logged; the next trigger tries again).
    """

    def __init__(self, path: str, pages: int | None = None) -> None:
        """A checkpointer of the database at ``path`` (``pages``: default
        :data:`WAL_CHECKPOINT_PAGES`, read when it is made)."""
        self.path = path
        self.pages = WAL_CHECKPOINT_PAGES if pages is None else pages
        self._shm: int | None = None  # descriptor of the wal-index, read-only
        self.checkpoints = 0
        self.seconds = 0.0
        self.failures = 0
        self._commits = 0
        self._wake = threading.Event()
        self._stop = False
        self._finish = False  # the bulk is copied: the writer's next COMMIT finishes
        self._finish_tries = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def note_commit(self) -> None:
        """After a COMMIT: every :data:`CHECK_EVERY` commits, read how many WAL frames are not
        yet copied into the database (the wal-index's ``mxFrame`` less ``nBackfill``: the file's
        size says nothing once the WAL starts again) and wake the thread at :attr:`pages`."""
        self._commits += 1
        if self._commits % CHECK_EVERY or self._stop or self._finish:
            return
        try:
            if self._shm is None:
                self._shm = os.open(self.path + "-shm", os.O_RDONLY)
            head = os.pread(self._shm, _N_BACKFILL + 4, 0)
        except OSError:
            return
        if len(head) < _N_BACKFILL + 4:
            return
        frames = int.from_bytes(head[_MX_FRAME : _MX_FRAME + 4], sys.byteorder)
        copied = int.from_bytes(head[_N_BACKFILL:], sys.byteorder)
        if frames - copied >= self.pages:
            self.wake()

    @property
    def finish_due(self) -> bool:
        """True after a run of the thread, until :meth:`finished`: the writer should now run
        ``PRAGMA wal_checkpoint(PASSIVE)`` itself, after its COMMIT (it copies the frames
        written during the thread's run, and the WAL starts again at the next write). The
        thread is not woken meanwhile."""
        return self._finish

    def finished(self, *, done: bool) -> None:
        """The writer's finishing checkpoint ran (``done``) or met a busy WAL (another
        process's checkpoint): tried again after the next COMMIT, :data:`FINISH_TRIES` times
        at most."""
        self._finish_tries += 1
        if done or self._finish_tries >= FINISH_TRIES:
            self._finish, self._finish_tries = False, 0

    def wake(self) -> None:
        """Ask for a checkpoint now (starting the thread if it has not run yet)."""
        with self._lock:
            if self._stop:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run,
                    name=f"dh-checkpoint {os.path.basename(self.path)}",
                    daemon=True,
                )
                self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint it is running, if any) and close its
        connection."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()
        if self._shm is not None:
            os.close(self._shm)
            self._shm = None

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while not self._stop:  # close() sets it before it wakes the thread
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    return
                if self._finish:  # the writer's turn first (a wake that raced the last run)
                    continue
                started = time.perf_counter()
                try:
                    if conn is None:
                        conn = connection.connect(self.path, "NORMAL")
                    for _ in range(PASSES):
                        # (busy, frames in the WAL, frames copied), -1s in a busy WAL's stead
                        ((_, frames, copied),) = conn.execute(
                            "PRAGMA wal_checkpoint(PASSIVE)"
                        ).fetchall()
                        if frames < 0 or frames - copied <= LEFT_FOR_WRITER or self._stop:
                            break
                except sqlite3.Error as exc:  # busy (another process checkpoints), I/O: later
                    self.failures += 1
                    log.warning("checkpoint of %s failed, to be tried again: %s", self.path, exc)
                    continue
                self.checkpoints += 1
                self.seconds += time.perf_counter() - started
                self._finish = True
                self._wake.clear()  # what asked during this run is served by it
        finally:
            if conn is not None:
                conn.close()
