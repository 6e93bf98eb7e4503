"""The fsync hand-off, written once for every backend: callers waiting for the same work (an fsync,
a group's transaction) elect one leader at a time to do it for all queued (:class:`SyncHandoff`
for syncs, :class:`GroupLeader` for threads' groups, :class:`TaskQueue` for tasks';
``design/storage.md`` "Write path (JSONL)" and "SQLite")."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import anyio.lowlevel
import anyio.to_thread

from durable_harness.storage.base import Op


class PendingCommit:
    """One commit waiting in a group-commit queue: its ops, then its outcome (``seq`` or
    ``error``) once ``done``."""

    __slots__ = ("done", "error", "ops", "seq")

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.done = False
        self.seq = 0
        self.error: BaseException | None = None


P = TypeVar("P", bound=PendingCommit)


@contextmanager
def settling(batch: list[P]) -> Iterator[None]:
    """Run a group of ``batch``: the block's error becomes every item's that has none (a
    non-``Exception`` is raised on), and every item is ``done`` after it."""
    try:
        yield
    except BaseException as exc:
        for item in batch:
            item.error = item.error or exc
        if not isinstance(exc, Exception):
            raise
    finally:
        for item in batch:
            item.done = True


class SyncHandoff:
    """Durability counted in tickets: ``synced``, the highest known durable, read or raised
    holding ``cond``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.synced = 0
        self._syncing = False

    def sync_to(self, ticket: int, sync: Callable[[], int]) -> None:
        """Return once every ticket up to ``ticket`` is durable: one caller at a time runs
        ``sync()`` (without ``cond``), which returns the ticket it covers; the callers it covers
        wait.

        Raises:
            whatever ``sync`` raised (the tickets it was to cover are not known durable).
        """
        with self.cond:
            while self.synced < ticket:
                if self._syncing:
                    self.cond.wait()
                    continue
                self._syncing = True
                self.cond.release()
                try:
                    covered = sync()
                finally:
                    self.cond.acquire()
                    self._syncing = False
                    self.cond.notify_all()
                self.synced = max(self.synced, covered)

    def covered(self, ticket: int) -> None:
        """Note that a sync made elsewhere covered every ticket up to ``ticket``."""
        with self.cond:
            self.synced = max(self.synced, ticket)


class GroupLeader(Generic[P]):
    """Threads' group commit: calls arriving while a group runs form the next, run by one of
    them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: list[P] = []
        self._leading = False

    def commit(self, item: P, run: Callable[[list[P]], None]) -> int:
        """Queue ``item``; return its ``seq`` once a group ran it, or raise its error (``run``
        settles all)."""
        with self.cond:
            self.queue.append(item)
            while not item.done:
                if self._leading:
                    self.cond.wait()
                    continue
                self._leading = True
                batch, self.queue = self.queue, []
                self.cond.release()
                try:
                    run(batch)
                finally:
                    self.cond.acquire()
                    self._leading = False
                    self.cond.notify_all()
        if item.error is not None:
            raise item.error
        return item.seq


class TaskQueue(Generic[P]):
    """Tasks' group commit: a call queues its item and yields once; the first to resume runs the
    whole queue. A call cancelled before its item was taken is not committed; one taken by a
    group in another thread waits for it in a worker thread."""

    def __init__(self) -> None:
        self.items: list[P] = []
        self.lock = threading.Lock()
        self.done = threading.Condition()  # notified after every group (see :meth:`ran`)

    def take(self) -> list[P]:
        """Take every queued item (the caller runs them, then calls :meth:`ran`)."""
        with self.lock:
            batch, self.items = self.items, []
        return batch

    def ran(self) -> None:
        """Wake the calls waiting for a group that ran in another thread."""
        with self.done:
            self.done.notify_all()

    async def commit(self, item: P, run: Callable[[list[P]], None]) -> int:
        """Queue ``item``; return its ``seq`` once a group ran it, or raise its error."""
        with self.lock:
            self.items.append(item)
        try:
            await anyio.lowlevel.checkpoint()
        except BaseException:
            with self.lock:
                if item in self.items:
                    self.items.remove(item)
            raise
        if not item.done:
            batch = self.take()
            if batch:
                try:
                    run(batch)
                finally:
                    self.ran()
        if not item.done:
            await anyio.to_thread.run_sync(self._wait, item)
        if item.error is not None:
            raise item.error
        return item.seq

    def _wait(self, item: P) -> None:
        with self.done:
            while not item.done:
                self.done.wait()
