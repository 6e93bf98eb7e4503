"""Group commit (``batch`` durability): commits that arrive while an fsync runs share the next
one, synchronously (:meth:`GroupSync.wait_durable`) or on an event loop
(:meth:`GroupSync.wait_durable_async`). Every fsync of the write path goes through here."""

from __future__ import annotations

import threading
import time

import anyio
import anyio.lowlevel
import anyio.to_thread

from durable_harness.storage.jsonl.file import SessionFile

INLINE_FSYNC_S = 0.002
"""Async group commit runs ``fdatasync`` on the event loop's thread while its moving average
stays under this many seconds, and in a worker thread above it (see ``wait_durable_async``)."""


class GroupSync:
    """How many commit lines of one :class:`~.file.SessionFile` are durable (``synced``, a
    count of ``file.written``), and the hand-off that lets commits share one fsync;
    ``fsync_avg_s``: moving average of the timed fsyncs (seconds)."""

    def __init__(self, file: SessionFile) -> None:
        self.file = file
        self.synced = 0
        self.fsync_avg_s = 0.0
        self._cond = threading.Condition()
        self._syncing = False
        self._async_flush: anyio.Event | None = None

    def sync(self, *, timed: bool = False) -> None:
        """fsync now (:meth:`SessionFile.sync`) and count what it covered as durable; ``timed``
        folds its duration into :attr:`fsync_avg_s`."""
        started = time.perf_counter() if timed else 0.0
        covered = self.file.sync()
        if timed:
            self.fsync_avg_s += (time.perf_counter() - started - self.fsync_avg_s) / 8
        with self._cond:
            self.synced = max(self.synced, covered)

    def wait_durable(self, ticket: int | None = None) -> None:
        """Block until commit line number ``ticket`` (default: every line so far) is fsynced."""
        if self.file.durability == "none" or self.file.closed:
            return
        target_ticket = self.file.written if ticket is None else ticket
        with self._cond:
            while self.synced < target_ticket:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                self._cond.release()
                try:
                    covered = self.file.sync()
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                self.synced = max(self.synced, covered)

    async def wait_durable_async(self) -> None:
        """Await an fsync covering every commit written so far (``batch`` mode): the caller
        yields once, so every task ready to commit writes its line, and the first to resume
        fsyncs for all of them; on the loop's thread while fsyncs are fast (under
        :data:`INLINE_FSYNC_S`), else a leader's worker thread (``design/storage.md``, "Group
        commit, tasks" has the measurements)."""
        if self.file.durability == "sync":
            self.wait_durable()  # sync mode: fsync now, in the caller's thread
            return
        if self.file.durability != "batch" or self.file.closed:
            return
        target = self.file.written
        if self.synced >= target:
            return
        if self.fsync_avg_s < INLINE_FSYNC_S:
            await anyio.lowlevel.checkpoint()
            if self.synced < target and self._async_flush is None:
                self.sync(timed=True)
        while self.synced < target:
            leader = self._async_flush
            if leader is not None:
                await leader.wait()
                continue
            event = self._async_flush = anyio.Event()
            try:
                await anyio.lowlevel.checkpoint()  # let the tasks ready to commit write first
                await anyio.to_thread.run_sync(lambda: self.sync(timed=True))
            finally:
                self._async_flush = None
                event.set()
