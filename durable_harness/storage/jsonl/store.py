"""One JSONL session file as a :class:`~durable_harness.storage.base.SessionStore`: the
in-memory index (:class:`~durable_harness.storage.indexed.IndexedSessionStore`) over a
:class:`~.file.SessionFile`, which owns the bytes, read at open by the pure :class:`~.scan.Scan`,
and group commit (``batch``): commits that arrive while an fsync runs share the next one
(:class:`~durable_harness.storage.handoff.SyncHandoff`, tickets being commit lines written)."""

from __future__ import annotations

import gc
import time
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from durable_harness.errors import ReadOnlySession
from durable_harness.storage import codec, timing
from durable_harness.storage.base import Durability
from durable_harness.storage.handoff import PendingCommit, SyncHandoff, TaskQueue, settling
from durable_harness.storage.indexed import IndexedSessionStore
from durable_harness.storage.jsonl.file import SessionFile
from durable_harness.storage.jsonl.framing import commit_line, op_seq
from durable_harness.storage.jsonl.scan import Scan

INLINE_FSYNC_S = 0.002
"""Async group commit runs ``fdatasync`` on the event loop's thread while its moving average
stays under this many seconds, and in a worker thread above it (see ``wait_durable_async``)."""


class JsonlSessionStore(IndexedSessionStore):
    """One session file, opened with :meth:`open_path` (made by :meth:`SessionFile.create`).

    Attributes:
        path: the file. file: the :class:`~.file.SessionFile` (descriptor, lease, mark...).
    """

    def __init__(self, file: SessionFile, header: dict[str, Any], *, read_only: bool) -> None:
        super().__init__(
            header, read_only=read_only, durability=file.durability, location=file.path
        )
        self.path = file.path
        self.file = file
        self._handoff = SyncHandoff()
        self._fsync_avg_s = 0.0  # moving average of the timed fsyncs, seconds
        self._async_flush: anyio.Event | None = None
        self._tasks: TaskQueue[PendingCommit] = TaskQueue()  # commit_async calls
        self._single_op: dict[int, bool] = {}
        self._line_cache: tuple[int, list[Any]] | None = None

    @classmethod
    def open_path(
        cls,
        path: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> JsonlSessionStore:
        """Open a durable-harness session file (``break_lease``: see :meth:`Store.open_session`).
        A writable open takes the lease first. Damage never raises: it is in ``store.damage``.

        Raises:
            SessionNotFound: no file at ``path``.
            SessionUnreadable: the file cannot be opened or read.
            CorruptSession: line 1 is not a durable-harness header (use the pi importer for pi
                files).
            LeaseHeld: ``write=True`` and another live process holds the lease.
        """
        file, data = SessionFile.open(
            path, write=write, durability=durability, break_lease=break_lease
        )
        try:
            scan = Scan(path, data)
            for _retry in range(2):  # a mark read while a writer rewrites it may fail its check
                if not any(d["kind"] == "bad_mark" for d in scan.damage):
                    break
                data = file.read_all()
                scan = Scan(path, data)
            store = cls(file, scan.header, read_only=not write)
            store._index(scan, data)
        except BaseException:
            file.release()
            raise
        return store

    def _index(self, scan: Scan, data: bytes) -> None:
        apply = self._apply
        # The collector off while the file is read (as it was if it was off): a line's parse
        # makes a dozen containers and frees them, and keeps a few tuples the first collection
        # untracks, so the collector would walk the young generation every few hundred lines
        # for nothing (7-8 % of a 100,000-line open: design/storage.md, "Opening a long session").
        collecting = gc.isenabled()
        gc.disable()
        try:
            for offset, length, ops in scan.commits():
                if len(ops) == 1:  # nearly every line (no enumerate to make)
                    apply(ops[0], (offset, length, 0))
                    continue
                for i, op in enumerate(ops):
                    apply(op, (offset, length, i))
        finally:
            if collecting:
                gc.enable()
        self.damage = scan.damage
        self.generation = self.file.begin(scan, data)
        if not self.read_only:  # lost commits keep their numbers (see SessionFile.begin)
            self._seq = max(self._seq, self.file.marked)

    # -- the write path --------------------------------------------------------------------
    def _persist(self, numbered: list[dict[str, Any]], sync: bool) -> list[Any]:
        self.file.check_lease()
        line = commit_line(self.generation, numbered)
        offset = self.file.end
        self.file.append(line, 1, op_seq(numbered[-1]))
        if sync and self.durability == "sync":
            self._handoff.covered(self.file.sync())
        return [(offset, len(line) - 1, i) for i in range(len(numbered))]

    def commit(self, ops: list[Any], *, wait: bool = True) -> int:
        """Commit ``ops`` as one line (see :meth:`SessionStore.commit`); in ``batch`` mode the
        fsync is shared with every commit written meanwhile. Timed as ``"commit"`` for
        :mod:`~durable_harness.storage.timing` when an observer is registered."""
        started = timing.start()
        seq = self._commit(ops, wait)
        timing.since("commit", started)
        return seq

    def _commit(self, ops: list[Any], wait: bool) -> int:
        if self.durability != "batch" or not wait:
            return super().commit(ops, wait=wait)
        with self._lock:
            seq = super().commit(ops, wait=False)
            ticket = self.file.written
        self.wait_durable(ticket)
        return seq

    async def commit_async(self, ops: list[Any]) -> int:
        """Commit ``ops`` and await its durability (see :meth:`SessionStore.commit_async`). In
        ``batch`` mode, group commit proper: the queued calls of the tasks that are ready share
        one lease check, one write and one fsync, each call's ops its own line, a failing one
        failing alone (``design/storage.md``, "Group commit, tasks"); with slow fsyncs each
        call commits, then awaits the shared fsync.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        if self.durability != "batch" or self._fsync_avg_s >= INLINE_FSYNC_S:
            return await super().commit_async(ops)
        if self.read_only:
            raise ReadOnlySession(f"session {self.session_id} at {self.location} is open read-only")
        if not ops:
            return self._seq
        started = timing.start()
        seq = await self._tasks.commit(PendingCommit(ops), self._commit_group)
        timing.since("commit", started)
        return seq

    def _commit_group(self, batch: list[PendingCommit]) -> None:
        """Commit queued :meth:`commit_async` calls: one line each, one write, one fsync."""
        with self._lock, settling(batch):
            self.file.check_lease()  # before anything is indexed: a stale writer fails them all
            lines: list[bytes] = []
            offset = self.file.end
            for item in batch:
                try:
                    self._check_ops(item.ops)
                    numbered = self._number(item.ops)
                    line = commit_line(self.generation, numbered)
                except Exception as exc:  # nothing of this call is indexed yet
                    item.error = exc
                    continue
                for i, op in enumerate(numbered):
                    self._apply(op, (offset, len(line) - 1, i))
                item.seq = self._seq
                lines.append(line)
                offset += len(line)
            if lines:
                self.file.append(b"".join(lines), len(lines), self._seq)
                self._timed_sync()

    def _timed_sync(self) -> None:
        """fsync now, folding its duration into the moving average that picks the thread."""
        started = time.perf_counter()
        covered = self.file.sync()
        self._fsync_avg_s += (time.perf_counter() - started - self._fsync_avg_s) / 8
        self._handoff.covered(covered)

    def wait_durable(self, ticket: int | None = None) -> None:
        """Block until commit line number ``ticket`` (default: every line so far) is fsynced."""
        if self.durability == "none" or self.file.closed:
            return
        self._handoff.sync_to(self.file.written if ticket is None else ticket, self.file.sync)

    async def wait_durable_async(self) -> None:
        """Await an fsync covering every commit written so far (``batch`` mode): the caller
        yields once, so every task ready to commit writes its line, and the first to resume
        fsyncs for all of them; on the loop's thread while fsyncs are fast (under
        :data:`INLINE_FSYNC_S`), else a leader's worker thread (``design/storage.md``, "Group
        commit, tasks" has the measurements)."""
        if self.durability == "sync":
            self.wait_durable()  # sync mode: fsync now, in the caller's thread
            return
        target = self.file.written
        if self.durability != "batch" or self.file.closed or self._handoff.synced >= target:
            return
        if self._fsync_avg_s < INLINE_FSYNC_S:
            await anyio.lowlevel.checkpoint()
            if self._handoff.synced < target and self._async_flush is None:
                self._timed_sync()
        while self._handoff.synced < target:
            leader = self._async_flush
            if leader is not None:
                await leader.wait()
                continue
            event = self._async_flush = anyio.Event()
            try:
                await anyio.lowlevel.checkpoint()  # let the tasks ready to commit write first
                await anyio.to_thread.run_sync(self._timed_sync)
            finally:
                self._async_flush = None
                event.set()

    def lease_holder(self) -> dict[str, Any] | None:
        return self.file.lease_holder()

    # -- reading, closing ------------------------------------------------------------------
    def _load_entry(self, entry_id: str, location: Any) -> dict[str, Any]:
        offset, length, idx = location
        # One commit line can hold many entries (an import commits hundreds at once): keep the
        # last decoded line so a walk or a full read decodes each line once, not once per entry.
        if idx == 0 and self._single_op.get(offset, True):
            ops = codec.loads(self.file.read(length, offset))["ops"]
            if len(ops) == 1:  # the common case: a fresh parse is already a private copy
                single: dict[str, Any] = ops[0]["entry"]
                return single
            self._single_op[offset] = False
            self._line_cache = (offset, ops)
        cached = self._line_cache
        if cached is not None and cached[0] == offset:
            ops = cached[1]
        else:
            ops = codec.loads(self.file.read(length, offset))["ops"]
            self._line_cache = (offset, ops)
        # A fresh copy per call: callers may mutate what they get.
        entry: dict[str, Any] = codec.loads(codec.dumps(ops[idx]["entry"]))
        return entry

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self.read_only and self.durability == "batch":
                self.wait_durable()
        finally:
            self.file.close()
