"""WAL checkpoints off the commit path: a thread of the store's own copies the WAL back into the
database once it holds about :data:`WAL_CHECKPOINT_PAGES`, so no commit waits for one
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
never sees: the frames written meanwhile remain. So once the thread has copied all but
:data:`LEFT_FOR_WRITER` frames, the writer copies the rest itself, right after its next COMMIT
(:meth:`Checkpointer.finish_due`): the few hundred pages written during the thread's run, not
the thousands before.

When to run: SQLite tells how many frames the WAL holds only in the wal-index (``-shm``), and
this process must not open that file itself: closing any descriptor of a file drops every POSIX
lock the process holds on it, SQLite's own included (``tests/storage/test_attack_*``). So the
frames are estimated from the commits since the WAL last started again, at the frames per
commit the last checkpoint saw (it reports the WAL's frames).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from durable_harness.storage.sqlite import connection

WAL_CHECKPOINT_PAGES = 10_000
"""WAL frames after which the checkpointer runs (SQLite's automatic default: 1,000). Commits of
different sessions share few pages (a group of 200 turn commits writes about 1,400), so a low
threshold copies nearly every group, and a checkpoint copies each page once however often the WAL
holds it."""

FRAMES_PER_COMMIT = 16.0
"""The first estimate of WAL frames per commit (a turn's commit writes about 16), until a
checkpoint has counted them."""

PASSES = 3
"""Passive checkpoints the thread runs in a row while the frames left after one exceed
:data:`LEFT_FOR_WRITER`."""

LEFT_FOR_WRITER = 1_000
"""Frames the thread may leave for the writer's own finishing checkpoint; with more left (a
reader holding an old snapshot) it does not hand over, and runs again later."""

FINISH_TRIES = 8
"""COMMITs after which the writer stops trying a finishing checkpoint that finds the WAL busy."""

log = logging.getLogger("durable_harness.storage")


class Checkpointer:
    """The checkpoint thread of one database at ``path`` (started on first need); ``pages`` is
    the WAL size in frames that calls for a checkpoint. :meth:`note_commit` is called after
    each COMMIT on the writer (holding the writer's lock), :meth:`close` once, before the
    writer closes.

    Attributes:
        checkpoints: the thread's runs. seconds: their total duration (s). failures: runs that
            raised (logged; tried again later). restarts: finishing checkpoints that copied the
            whole WAL (the next write starts it again). writer_frames: the most frames a
            finishing checkpoint of the writer copied.
    """

    def __init__(self, path: str, pages: int | None = None) -> None:
        """A checkpointer of the database at ``path`` (``pages``: default
        :data:`WAL_CHECKPOINT_PAGES`, read when it is made)."""
        self.path = path
        self.pages = WAL_CHECKPOINT_PAGES if pages is None else pages
        self.checkpoints = 0
        self.seconds = 0.0
        self.failures = 0
        self.restarts = 0
        self.writer_frames = 0
        self._copied = 0  # frames copied when the thread handed over
        self._since = 0  # commits since the WAL last started again (as far as known)
        self._per_commit = FRAMES_PER_COMMIT
        self._wake_at = self._due()
        self._wake = threading.Event()
        self._stop = False
        self._finish = False  # the bulk is copied: the writer's next COMMIT finishes
        self._finish_tries = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _due(self) -> int:
        """Commits after which the WAL holds :attr:`pages` frames, at the current estimate."""
        return max(1, int(self.pages / self._per_commit))

    def note_commit(self) -> None:
        """After a COMMIT: wake the thread once the estimated frames reach :attr:`pages` (no
        system call)."""
        self._since += 1
        if self._since >= self._wake_at and not self._finish and not self._stop:
            self._wake_at = self._since + max(1, self._due() // 4)  # if this run cannot finish
            self.wake()

    @property
    def finish_due(self) -> bool:
        """True after a run of the thread that left at most :data:`LEFT_FOR_WRITER` frames,
        until :meth:`finished`: the writer should now run ``PRAGMA wal_checkpoint(PASSIVE)``
        itself, after its COMMIT (it copies the frames written during the thread's run, and the
        WAL starts again at the next write). The thread is not woken meanwhile."""
        return self._finish

    def finished(self, result: tuple[int, int, int] | None) -> None:
        """The writer's finishing checkpoint returned ``result`` (``(busy, frames, copied)``;
        ``None``: it raised): done when every frame was copied, else tried again after the next
        COMMIT, :data:`FINISH_TRIES` times at most."""
        done = result is not None and result[0] == 0 and result[1] == result[2]
        if result is not None and result[2] >= 0:
            self.writer_frames = max(self.writer_frames, result[2] - self._copied)
        self._finish_tries += 1
        if done:
            self.restarts += 1
            self._since = 0
            self._wake_at = self._due()
        if done or self._finish_tries >= FINISH_TRIES:
            self._finish, self._finish_tries = False, 0

    def wake(self) -> None:
        """Ask for a checkpoint now (starting the thread if it has not run yet)."""
        with self._lock:
            if self._stop:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"dh-checkpoint {self.path}", daemon=True
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
                since = self._since
                try:
                    if conn is None:
                        conn = connection.connect(self.path, "NORMAL")
                    left = -1
                    for _ in range(PASSES):
                        # (busy, frames in the WAL, frames copied), -1s in a busy WAL's stead
                        ((_, frames, copied),) = conn.execute(
                            "PRAGMA wal_checkpoint(PASSIVE)"
                        ).fetchall()
                        if frames < 0:
                            break
                        if since > 0 and frames > 0:
                            self._per_commit = frames / since
                        left = frames - copied
                        if left <= LEFT_FOR_WRITER or self._stop:
                            break
                        since = self._since
                except sqlite3.Error as exc:  # busy (another process checkpoints), I/O: later
                    self.failures += 1
                    log.warning("checkpoint of %s failed, to be tried again: %s", self.path, exc)
                    continue
                self.checkpoints += 1
                self.seconds += time.perf_counter() - started
                if 0 <= left <= LEFT_FOR_WRITER:
                    self._copied = copied
                    self._finish = True
                self._wake.clear()  # what asked during this run is served by it
        finally:
            if conn is not None:
                conn.close()
