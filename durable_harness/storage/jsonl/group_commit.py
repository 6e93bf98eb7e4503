"""Group commit (``batch`` durability): commits that arrive while an fsync runs share the next
one, synchronously (:func:`wait_durable`) or on an event loop (:func:`wait_durable_async`,
:func:`commit_group`). Every ``fdatasync`` of the write path goes through here."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import anyio.to_thread

from durable_harness.storage.handoff import PendingCommit, settling
from durable_harness.storage.jsonl.framing import barrier, commit_line
from durable_harness.storage.jsonl.mark import set_mark

if TYPE_CHECKING:
    from durable_harness.storage.jsonl.store import JsonlSessionStore


INLINE_FSYNC_S = 0.002
"""Async group commit runs ``fdatasync`` on the event loop's thread while its moving average
stays under this many seconds, and in a worker thread above it (see ``wait_durable_async``)."""


def commit_group(store: JsonlSessionStore, batch: list[PendingCommit]) -> None:
    """Commit queued :meth:`commit_async` calls: one line each, one write, one fsync."""
    with store._lock, settling(batch):
        assert store._lease is not None
        store._lease.check()  # before anything is indexed: a stale writer fails them all
        lines: list[bytes] = []
        offset = store._end
        for item in batch:
            try:
                store._check_ops(item.ops)
                numbered = store._number(item.ops)
                line = commit_line(store.generation, numbered)
            except Exception as exc:  # nothing of this call is indexed yet
                item.error = exc
                continue
            for i, op in enumerate(numbered):
                store._apply(op, (offset, len(line) - 1, i))
            item.seq = store._seq
            lines.append(line)
            offset += len(line)
        if lines:
            store._append(b"".join(lines), len(lines), store._seq)
            covered, covered_seq = store._written, store._written_seq
            timed_fdatasync(store)
            store._handoff.covered(covered)
            set_mark(store, covered_seq)


def wait_durable(store: JsonlSessionStore, ticket: int | None = None) -> None:
    """Block until commit number ``ticket`` (default: every commit so far) is fsynced."""
    if store.durability == "none" or store._fd is None:
        return

    def sync() -> int:  # the leader's fsync (storage/handoff.py)
        covered, covered_seq = store._written, store._written_seq
        barrier(store)
        set_mark(store, covered_seq)
        return covered

    store._handoff.sync_to(store._written if ticket is None else ticket, sync)


async def wait_durable_async(store: JsonlSessionStore) -> None:
    """Await an fsync covering every commit written so far (``batch`` mode).

    The async form of group commit. The caller yields once, so that every task ready to
    commit writes its line; the first task to resume then runs one ``fdatasync`` covering
    all of them, and the others find their line durable when they resume: one yield and
    one wakeup per commit, one fsync per batch.

    That fsync runs on the event loop's thread while fsyncs are fast (a moving average
    under :data:`INLINE_FSYNC_S`). Why: a worker-thread round trip costs about as much as
    a fast fsync (measured 120 µs against 160-200 µs on the development machine), and a
    thread that finished its fsync then waits for the GIL until the loop goes idle. Once
    fsyncs are slow, a leader runs them in a worker thread instead and the other tasks
    await its event, so a slow disk does not stall every task on the loop.
    """
    if store.durability == "sync":
        wait_durable(store)  # sync mode: fsync now, in the caller's thread
        return
    if store.durability != "batch" or store._fd is None:
        return
    target = store._written
    if store._handoff.synced >= target:
        return
    if store._fsync_avg_s < INLINE_FSYNC_S:
        await anyio.lowlevel.checkpoint()
        if store._handoff.synced < target and store._async_flush is None:
            covered, covered_seq = store._written, store._written_seq
            timed_fdatasync(store)
            store._handoff.covered(covered)
            set_mark(store, covered_seq)
    while store._handoff.synced < target:
        leader = store._async_flush
        if leader is not None:
            await leader.wait()
            continue
        event = store._async_flush = anyio.Event()
        try:
            await anyio.lowlevel.checkpoint()  # let the tasks ready to commit write first
            covered, covered_seq = store._written, store._written_seq
            await anyio.to_thread.run_sync(timed_fdatasync, store)
            store._handoff.covered(covered)
            set_mark(store, covered_seq)
        finally:
            store._async_flush = None
            event.set()


def timed_fdatasync(store: JsonlSessionStore) -> None:
    """``fdatasync`` the file, folding the time it took into the moving average
    (``store._fsync_avg_s``) that picks the async leader's thread."""
    assert store._fd is not None
    started = time.perf_counter()
    barrier(store)
    store._fsync_avg_s += (time.perf_counter() - started - store._fsync_avg_s) / 8
