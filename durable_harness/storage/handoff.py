"""The fsync hand-off, written once for every backend: callers waiting for the same work (an fsync,
a group's transaction) elect one leader at a time to do it for all queued (:class:`SyncHandoff`
for syncs, :class:`GroupLeader` for threads' groups, :class:`TaskQueue` for tasks';
``design/storage.md`` "Write path (JSONL)" and "SQLite").

A sync that a tasks' group asks for while syncs are slow (:data:`INLINE_SYNC_S`) runs in a worker
thread after the group, not on the event loop's thread: the loop goes on running the other tasks
while the disk syncs (``fdatasync`` releases the GIL), and the group's calls return once it is
done (``design/host.md``, "Many sessions in one process")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from durable_harness.storage.base import Op

INLINE_SYNC_S = 0.002
"""A tasks' group runs the sync it asks for on the event loop's thread while the moving average of
:class:`SyncHandoff`'s syncs stays under this many seconds, and in a worker thread above it (a
worker-thread round trip costs about as much as a fast sync: ``design/storage.md``, "Group
commit, tasks")."""

_SYNC_AVG_WEIGHT = 8  # the moving average's window, in syncs


class PendingCommit:
    """One commit waiting in a group-commit queue: its ops, then its outcome (``seq`` or
    ``error``) once ``done``; while ``syncing`` is set, the sync that makes it durable is still
    running (a :class:`TaskQueue` call returns only once it is ``None``)."""

    __slots__ = ("done", "error", "ops", "seq", "syncing")

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.done = False
        self.seq = 0
        self.error: BaseException | None = None
        self.syncing: DeferredSyncs | None = None


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


class DeferredSyncs:
    """The syncs a :class:`TaskQueue` group asked for while it ran on the event loop's thread
    (:meth:`SyncHandoff.sync_to` with syncs slow), run after it in a worker thread. From the
    first one asked, every item of the group is ``syncing`` (so ``done`` alone never lets a call
    return early); :meth:`finish` clears that and wakes the calls."""

    def __init__(self, batch: list[P]) -> None:
        self.batch: list[PendingCommit] = list(batch)
        self.syncs: list[Callable[[], None]] = []
        self.inline = False  # a sync was run at once (syncs are fast)
        self.thread = threading.get_ident()  # the loop's thread: its calls await ``synced``
        self.synced = anyio.Event()

    def ask(self, sync: Callable[[], None]) -> None:
        """Run ``sync`` after the group (it makes the group's commits durable)."""
        if not self.syncs:
            for item in self.batch:
                item.syncing = self
        self.syncs.append(sync)

    def run(self) -> None:
        """In a worker thread: every sync asked, in order.

        Raises:
            whatever a sync raised (the commits it was to cover are not known durable).
        """
        for sync in self.syncs:
            sync()

    def finish(self, error: BaseException | None) -> None:
        """The syncs are over: ``error`` (``None``: all done) becomes every item's that has
        none; the items stop ``syncing``; the calls waiting on the loop are woken."""
        for item in self.batch:
            if error is not None:
                item.error = item.error or error
            item.syncing = None
        self.synced.set()


class _Deferring(threading.local):
    """The :class:`DeferredSyncs` of the group running on this thread, if any."""

    current: DeferredSyncs | None = None


_deferring = _Deferring()


class SyncHandoff:
    """Durability counted in tickets: ``synced``, the highest known durable, read or raised
    holding ``cond``; ``avg_s``, the moving average of the syncs' durations (seconds)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.synced = 0
        self.avg_s = 0.0
        self._syncing = False

    def sync_to(self, ticket: int, sync: Callable[[], int]) -> None:
        """Return once every ticket up to ``ticket`` is durable: one caller at a time runs
        ``sync()`` (without ``cond``), which returns the ticket it covers; the callers it covers
        wait. Called by a :class:`TaskQueue` group on the event loop's thread while syncs are
        slow (``avg_s`` >= :data:`INLINE_SYNC_S`), it returns at once and the sync runs after the
        group in a worker thread (:class:`DeferredSyncs`): the group's calls return only once it
        is done.

        Raises:
            whatever ``sync`` raised (the tickets it was to cover are not known durable).
        """
        if self.synced >= ticket:
            return
        deferred = _deferring.current
        if deferred is not None:
            if self.avg_s >= INLINE_SYNC_S:
                deferred.ask(lambda: self._sync_to(ticket, sync))
                return
            deferred.inline = True
        self._sync_to(ticket, sync)

    def _sync_to(self, ticket: int, sync: Callable[[], int]) -> None:
        with self.cond:
            while self.synced < ticket:
                if self._syncing:
                    self.cond.wait()
                    continue
                self._syncing = True
                self.cond.release()
                started = time.perf_counter()
                try:
                    covered = sync()
                finally:
                    took = time.perf_counter() - started
                    self.cond.acquire()
                    self._syncing = False
                    self.avg_s += (took - self.avg_s) / _SYNC_AVG_WEIGHT
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
    whole queue (a slow sync the group asks for then runs in a worker thread while the loop goes
    on: :class:`DeferredSyncs`). While syncs run in a worker thread, a barrier (an item with no
    ops) that finds none running leads at once, without the yield: its sync starts while the
    other tasks run, and the barriers arriving meanwhile share the next. A call cancelled before
    its item was taken is not committed; one taken is not abandoned (it returns once its group's
    sync is over); one taken by a group in another thread waits for it in a worker thread."""

    def __init__(self) -> None:
        self.items: list[P] = []
        self.lock = threading.Lock()
        self.done = threading.Condition()  # notified after every group (see :meth:`ran`)
        self._deferring = False  # the last group that synced deferred its sync to a thread
        self._in_flight = 0  # deferred syncs not over yet

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
        """Queue ``item``; return its ``seq`` once a group ran it and its sync is over, or raise
        its error."""
        with self.lock:
            self.items.append(item)
        if item.ops or not self._deferring or self._in_flight:
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
                await self._lead(batch, run)
        pending = item.syncing
        if pending is not None and pending.thread == threading.get_ident():
            with anyio.CancelScope(shield=True):  # taken: the call is not abandoned
                await pending.synced.wait()
        if not item.done or item.syncing is not None:
            await anyio.to_thread.run_sync(self._wait, item)
        if item.error is not None:
            raise item.error
        return item.seq

    async def _lead(self, batch: list[P], run: Callable[[list[P]], None]) -> None:
        """Run ``batch`` on this thread; the syncs it deferred in a worker thread after it."""
        deferred = DeferredSyncs(batch)
        error: BaseException | None = None
        _deferring.current = deferred
        try:
            run(batch)
        finally:
            _deferring.current = None
            if not deferred.syncs:
                self.ran()
        if not deferred.syncs:
            if deferred.inline:
                self._deferring = False
            return
        self._deferring = True
        self._in_flight += 1
        try:
            with anyio.CancelScope(shield=True):  # the group's calls wait for this sync
                await anyio.to_thread.run_sync(deferred.run)
        except BaseException as exc:
            error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            with self.done:
                deferred.finish(error)
                self.done.notify_all()

    def _wait(self, item: P) -> None:
        with self.done:
            while not item.done or item.syncing is not None:
                self.done.wait()
