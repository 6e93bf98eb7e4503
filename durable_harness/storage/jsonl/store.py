"""One JSONL session file as a :class:`~durable_harness.storage.base.SessionStore`: creating
and opening it, the write path (one line per commit, padding), reading entries back, close.
The jobs around it live in sibling modules: scan, quarantine, takeover, group_commit, mark."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import anyio

from durable_harness.errors import (
    CorruptSession,
    ReadOnlySession,
    SessionExists,
    SessionNotFound,
    StaleGeneration,
    StorageError,
)
from durable_harness.fs import fsync_dir
from durable_harness.storage import codec, timing
from durable_harness.storage.barrier_trace import BarrierTrace, open_trace
from durable_harness.storage.base import Durability, PendingCommit, queued_commit
from durable_harness.storage.indexed import IndexedSessionStore
from durable_harness.storage.jsonl import group_commit
from durable_harness.storage.jsonl.framing import (
    PAD,
    PAD_MAX,
    PAD_MIN,
    barrier,
    commit_line,
    op_seq,
    open_and_read,
    pwrite_all,
    read_all,
    write_all,
)
from durable_harness.storage.jsonl.mark import MARK_KEY, mark_text, set_mark, sync_mark
from durable_harness.storage.jsonl.quarantine import quarantine_tail
from durable_harness.storage.jsonl.scan import read_session
from durable_harness.storage.jsonl.takeover import detach_old_writer
from durable_harness.storage.lease import FileLease
from durable_harness.storage.private import private_fd, tighten_fd


class JsonlSessionStore(IndexedSessionStore):
    """One session file. Open with :meth:`open_path` or :meth:`create`."""

    def __init__(
        self, path: str, header: dict[str, Any], *, read_only: bool, durability: Durability
    ) -> None:
        super().__init__(header, read_only=read_only, durability=durability, location=path)
        self.path = path
        self._fd: int | None = None
        self._lease: FileLease | None = None
        self._sync_cond = threading.Condition()
        self._written = 0
        self._end = 0  # where the next commit line goes: the end of the data
        self._size = 0  # the file's size: the data plus any preallocated padding after it
        self._single_op: dict[int, bool] = {}
        self._synced = 0
        self._syncing = False
        self._queue: list[PendingCommit] = []  # commit_async calls waiting for their group
        # The high-water mark (see MARK_KEY): where its text sits in line 1 (None: this file
        # has none), the seq it holds, the seq last fsynced with it, and the last seq written.
        self._mark_at: int | None = None
        self._marked = 0
        self._mark_synced = 0
        self._mark_lock = threading.Lock()
        self._written_seq = 0

    # -- creation and opening --------------------------------------------------------------
    @classmethod
    def create(
        cls, path: str, header: dict[str, Any], *, durability: Durability = "sync"
    ) -> JsonlSessionStore:
        """Create ``path`` exclusively (mode 0600) with ``header`` as line 1; open for writing.

        Raises:
            SessionExists: the file already exists (it is never overwritten).
        """
        header = {**header, MARK_KEY: mark_text(0)}
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError as exc:
            raise SessionExists(f"session file {path} already exists", path=path) from exc
        try:
            private_fd(fd)
            write_all(fd, codec.dumps(header) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path) or ".")
        return cls.open_path(path, write=True, durability=durability)

    @classmethod
    def open_path(
        cls,
        path: str,
        *,
        write: bool = True,
        durability: Durability = "sync",
        break_lease: bool = False,
    ) -> JsonlSessionStore:
        """Open a durable-harness session file.

        A writable open takes the lease first, then quarantines a torn tail. Damage never raises:
        it is listed in ``store.damage``.

        Raises:
            SessionNotFound: no file at ``path``.
            CorruptSession: line 1 is not a durable-harness header (use the pi importer for pi
                files).
            LeaseHeld: ``write=True`` and another live process holds the lease.
        """
        if not os.path.exists(path):
            raise SessionNotFound(f"no session file at {path}", path=path)
        lease = None
        if write:
            lease = FileLease(path + ".lock", f"session file {path}")
            lease.acquire(break_lease=break_lease)
        try:
            fd, data = open_and_read(path, os.O_RDWR if write else os.O_RDONLY)
            if write:
                tighten_fd(fd)
            for attempt in range(3):  # a mark read while a writer rewrites it may fail its check
                store = read_session(cls, path, data, read_only=not write, durability=durability)
                if attempt == 2 or not any(d["kind"] == "bad_mark" for d in store.damage):
                    break
                os.lseek(fd, 0, os.SEEK_SET)
                data = read_all(fd)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        store._fd = fd
        store._lease = lease
        if lease is not None:
            store.generation = lease.raise_floor(store._last_gen)
            # Lost commits keep their numbers: the next commit is numbered past the mark, so
            # the hole stays visible (seq_gap) after the mark has moved on.
            store._seq = max(store._seq, store._marked)
            store._written_seq = store._mark_synced = store._marked = store._seq
            quarantine_tail(store, data)
            store._size = os.fstat(store._fd).st_size
            if lease.contested:
                detach_old_writer(store, data[: store._end])
            store._trace = open_trace(path)
            if store._trace is not None:  # the trace starts here: the file as found is durable
                store._trace.record(store._end, store._marked)
        return store

    # -- the write path --------------------------------------------------------------------
    def _persist(self, numbered: list[dict[str, Any]], sync: bool) -> list[Any]:
        assert self._fd is not None and self._lease is not None
        self._lease.check()
        line = commit_line(self.generation, numbered)
        offset = self._end
        self._append(line, 1, op_seq(numbered[-1]))
        if sync and self.durability == "sync":
            barrier(self)
            self._synced = self._written
            set_mark(self, self._written_seq)
        length = len(line) - 1
        return [(offset, length, i) for i in range(len(numbered))]

    def _append(self, data: bytes, lines: int, last_seq: int) -> None:
        """Write ``lines`` whole commit lines at the end of the data (inside the padding, or
        growing it). Raises the ``OSError`` of a failed write, after which the file and the
        index may disagree: the store then refuses every later commit."""
        fd = self._fd
        assert fd is not None
        if self._write_error is not None:
            raise self._write_error
        offset = self._end
        end = offset + len(data)
        try:
            if end <= self._size or self.durability == "none":
                pwrite_all(fd, data, offset)
                self._size = max(self._size, end)
            else:  # grow: the lines plus fresh padding in one write
                pad = min(PAD_MAX, max(PAD_MIN, end))
                pwrite_all(fd, data + PAD * pad, offset)
                self._size = end + pad
        except OSError as exc:
            self._write_error = StorageError(
                f"session file {self.path}: a write failed ({exc}); reopen the session to "
                "continue from what reached the file"
            )
            raise
        self._end = end
        self._written += lines
        self._written_seq = last_seq

    _write_error: StorageError | None = None

    def commit(self, ops: list[Any], *, wait: bool = True) -> int:
        """Commit ``ops`` as one line (see :meth:`SessionStore.commit`).

        In ``batch`` mode the line is written under the lock and the fsync is shared with every
        other commit written meanwhile. With ``wait=False`` (``sync`` or ``batch``) the call
        returns before any fsync; :meth:`wait_durable` makes it durable later. The harness uses
        that for settlements, which the next intent's fsync covers (``design/run-loop.md``).
        A commit that returns is reported to :mod:`~durable_harness.storage.timing` as
        ``"commit"`` when an observer is registered.
        """
        if not timing.enabled():
            return self._commit(ops, wait)
        started = time.perf_counter()
        seq = self._commit(ops, wait)
        timing.observe("commit", time.perf_counter() - started)
        return seq

    def _commit(self, ops: list[Any], wait: bool) -> int:
        if self.durability != "batch" or not wait:
            return super().commit(ops, wait=wait)
        with self._lock:
            seq = super().commit(ops, wait=False)
            ticket = self._written
        self.wait_durable(ticket)
        return seq

    async def commit_async(self, ops: list[Any]) -> int:
        """Commit ``ops`` and await its durability (see :meth:`SessionStore.commit_async`).

        In ``batch`` mode this is group commit proper: the call queues its ops and yields once;
        the first queued task to resume then commits the whole queue, each call's ops as its
        own line (validated, numbered and indexed in queue order, a failing one failing alone),
        with one lease check, one write and one ``fdatasync`` for all of them. The others find
        their commit done when they resume. A call cancelled before its ops were taken is not
        committed; one cancelled later may have been. With slow fsyncs (see
        :meth:`wait_durable_async`) each call commits and then awaits the shared fsync.

        Raises:
            ReadOnlySession, IdConflict, UnknownEntry, StaleGeneration: as :meth:`commit`.
        """
        if self.durability != "batch" or self._fsync_avg_s >= group_commit.INLINE_FSYNC_S:
            return await super().commit_async(ops)
        if self.read_only:
            raise ReadOnlySession(f"session {self.session_id} at {self.location} is open read-only")
        if not ops:
            return self._seq

        def commit_batch(batch: list[PendingCommit]) -> None:
            group_commit.commit_group(self, batch)

        if not timing.enabled():
            return await queued_commit(self._queue, ops, commit_batch)
        started = time.perf_counter()
        seq = await queued_commit(self._queue, ops, commit_batch)
        timing.observe("commit", time.perf_counter() - started)
        return seq

    def wait_durable(self, ticket: int | None = None) -> None:
        """Block until commit number ``ticket`` (default: every commit so far) is fsynced
        (:func:`.group_commit.wait_durable`)."""
        group_commit.wait_durable(self, ticket)

    async def wait_durable_async(self) -> None:
        """Await an fsync covering every commit written so far
        (:func:`.group_commit.wait_durable_async`)."""
        await group_commit.wait_durable_async(self)

    _trace: BarrierTrace | None = None  # power-cut tests only (storage/barrier_trace.py)
    _torn: tuple[int, bytes] | None = None  # a torn final line found by the scan: (offset, bytes)
    _last_gen = 0
    _lines = 1  # the number of the last line read (header included)
    _fsync_avg_s = 0.0  # moving average of the async leader's fsync time, seconds
    _async_flush: anyio.Event | None = None

    def lease_holder(self) -> dict[str, Any] | None:
        return (self._lease or FileLease(self.path + ".lock", self.path)).probe()

    _line_cache: tuple[int, list[Any]] | None = None

    def _load_entry(self, entry_id: str, location: Any) -> dict[str, Any]:
        offset, length, idx = location
        # One commit line can hold many entries (an import commits hundreds at once): keep the
        # last decoded line so a walk or a full read decodes each line once, not once per entry.
        fd = self._fd
        if fd is None:
            raise CorruptSession(f"session file {self.path} is closed")
        if idx == 0 and self._single_op.get(offset, True):
            ops = codec.loads(os.pread(fd, length, offset))["ops"]
            if len(ops) == 1:  # the common case: a fresh parse is already a private copy
                single: dict[str, Any] = ops[0]["entry"]
                return single
            self._single_op[offset] = False
            self._line_cache = (offset, ops)
        cached = self._line_cache
        if cached is not None and cached[0] == offset:
            ops = cached[1]
        else:
            ops = codec.loads(os.pread(fd, length, offset))["ops"]
            self._line_cache = (offset, ops)
        # A fresh copy per call: callers may mutate what they get.
        entry: dict[str, Any] = codec.loads(codec.dumps(ops[idx]["entry"]))
        return entry

    def _trim_padding(self) -> None:
        """Cut the preallocated padding off at close (the file is valid with or without it).

        Only while this writer still holds the lease and the padding is intact: a stale writer
        must never cut into lines a newer writer wrote over its padding.
        """
        fd = self._fd
        if fd is None or self.read_only or self._lease is None or self._size <= self._end:
            return
        try:
            self._lease.check()
        except StaleGeneration:
            return
        if os.fstat(fd).st_size == self._size and not os.pread(
            fd, self._size - self._end, self._end
        ).strip(PAD):
            os.ftruncate(fd, self._end)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            if not self.read_only and self.durability == "batch":
                self.wait_durable()
            sync_mark(self)
            self._trim_padding()
            os.close(self._fd)
            self._fd = None
        if self._trace is not None:
            self._trace.close()
            self._trace = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None
