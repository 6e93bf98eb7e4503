"""One session file as an object that owns its state: the descriptor and the writer lease, the
write into the padding, the barrier, the high-water mark, the quarantine of a torn tail and the
takeover (``design/storage.md``). Every system call on the file is made here, inside an
explicit boundary: an ``OSError`` leaves as a typed error naming the file
(:func:`~durable_harness.storage.oserrors.translate`)."""

from __future__ import annotations

import os
import threading
import time
from contextlib import suppress
from typing import Any

from durable_harness.errors import (
    SessionClosed,
    SessionExists,
    SessionNotFound,
    StaleGeneration,
    StorageError,
)
from durable_harness.fs import fsync_dir, write_all
from durable_harness.storage import timing
from durable_harness.storage.barrier_trace import BarrierTrace, open_trace
from durable_harness.storage.base import Durability, unreadable_error
from durable_harness.storage.jsonl.framing import PAD, PAD_MAX, PAD_MIN, header_line, mark_text
from durable_harness.storage.jsonl.scan import Scan
from durable_harness.storage.lease import FileLease
from durable_harness.storage.oserrors import storage_boundary, translate
from durable_harness.storage.private import private_fd, tighten_fd


class SessionFile:
    """An open session file (:meth:`open`, then :meth:`begin`). ``end``: where the next commit
    line goes; ``written``: lines written since the open, ``written_seq`` the last seq in them;
    ``marked``: the seq the high-water mark holds."""

    def __init__(self, path: str, lease: FileLease | None, durability: Durability) -> None:
        self.path = path
        self.durability = durability
        self.end = self.written = self.written_seq = self.marked = 0
        self._fd: int | None = None
        self._lease = lease
        self._size = 0  # the file's size: the data plus any preallocated padding after it
        self._write_error: StorageError | None = None  # set once a write failed
        self._trace: BarrierTrace | None = None  # power-cut tests only (barrier_trace.py)
        self._mark_at: int | None = None  # where the mark's text sits in line 1 (None: none)
        self._mark_synced = 0  # the mark last fsynced
        self._mark_lock = threading.Lock()

    # -- opening -----------------------------------------------------------------------------
    @staticmethod
    def create(path: str, header: dict[str, Any]) -> None:
        """Create ``path`` exclusively (0600) holding line 1, durably (file and name).

        Raises:
            SessionExists: the file already exists (it is never overwritten).
        """
        with storage_boundary(path):
            try:
                os.close(_new_file(path, header_line(header), os.O_RDWR | os.O_APPEND))
            except FileExistsError as exc:
                raise SessionExists(f"session file {path} already exists", path=path) from exc
            fsync_dir(os.path.dirname(path) or ".")

    @classmethod
    def open(
        cls, path: str, *, write: bool, durability: Durability, break_lease: bool
    ) -> tuple[SessionFile, bytes]:
        """Open the session file at ``path`` and read it whole; a writable open takes the
        writer lease first (``break_lease``: even from a live holder).

        Raises:
            SessionNotFound: no file at ``path``.
            SessionUnreadable: the file cannot be opened or read (permissions, I/O error...).
            LeaseHeld: ``write`` and another live process holds the lease.
        """
        with storage_boundary(path):
            if not os.path.exists(path):
                raise SessionNotFound(f"no session file at {path}", path=path)
            lease = FileLease(path + ".lock", f"session file {path}") if write else None
            if lease is not None:
                lease.acquire(break_lease=break_lease)
            file = cls(path, lease, durability)
            try:
                try:
                    file._fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
                except OSError as exc:
                    what = "cannot be opened for writing" if write else "cannot be read"
                    raise unreadable_error(path, exc, what=what) from exc
                if write:
                    tighten_fd(file._fd)
                return file, file.read_all()
            except BaseException:
                file.release()
                raise

    def read_all(self) -> bytes:
        """The file's whole content, read now (raises SessionUnreadable)."""
        fd = self._live_fd()
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            # one read of the size fstat gives (a 62 MB file's chunks joined cost a second copy
            # of it, 70 ms), then whatever the file grew by meanwhile
            chunks = [os.read(fd, max(os.fstat(fd).st_size, 1 << 16))]
            while chunks[-1] and (chunk := os.read(fd, 1 << 22)):
                chunks.append(chunk)
        except OSError as exc:
            raise unreadable_error(self.path, exc) from exc
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def begin(self, scan: Scan, data: bytes) -> int:
        """Carry on from ``scan`` of ``data`` (this file's bytes); return this writer's
        generation (0: read-only). A writer also numbers on past the mark (lost commits keep
        their numbers), quarantines a torn tail, takes a contested file over (:meth:`_detach`)."""
        self.end, self._mark_at, self.marked = scan.end, scan.mark_at, scan.mark or 0
        if self._lease is None:
            return 0
        fd = self._live_fd()
        with storage_boundary(self.path):
            generation = self._lease.raise_floor(scan.generation)
            self.written_seq = self._mark_synced = self.marked = max(scan.seq, self.marked)
            if scan.torn is not None:
                side = self._quarantine(*scan.torn)
                for item in (d for d in scan.damage if d["kind"] == "torn_tail"):
                    item["quarantined_to"] = side
            self._size = os.fstat(fd).st_size
            if self._lease.contested:
                self._detach(data[: self.end])
            self._trace = open_trace(self.path)
            if self._trace is not None:  # the trace starts here: the file as found is durable
                self._trace.record(self.end, self.marked)
        return generation

    def _quarantine(self, offset: int, tail: bytes) -> str:
        """Move a torn final line to ``<path>.torn-<offset>``, cut it off; return the side file."""
        side = f"{self.path}.torn-{offset}"
        n = 1
        while os.path.exists(side):  # never overwrite bytes quarantined earlier
            n += 1
            side = f"{self.path}.torn-{offset}.{n}"
        os.close(_new_file(side, tail, os.O_WRONLY))
        fd = self._live_fd()
        os.ftruncate(fd, offset)
        os.fsync(fd)
        fsync_dir(os.path.dirname(self.path) or ".")
        return side

    def _detach(self, content: bytes) -> None:
        """Move the session to a new inode holding ``content`` (the data, without padding),
        when the lease was taken from a writer that may still be alive: a write or trim slipping
        past its lease check lands on the old inode (``design/storage.md``, "Write path")."""
        tmp = f"{self.path}.takeover-{os.getpid()}-{time.monotonic_ns()}"
        fd = _new_file(tmp, content, os.O_RDWR)
        try:
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        fsync_dir(os.path.dirname(self.path) or ".")
        os.close(self._live_fd())
        self._fd, self._size = fd, len(content)

    # -- the write path ----------------------------------------------------------------------
    def check_lease(self) -> None:
        """Raise :class:`StaleGeneration` once another writer took the lease (one ``fstat``)."""
        self._live_fd()
        try:
            if self._lease is not None:
                self._lease.check()
        except OSError as exc:
            raise translate(exc, self.path) from exc

    def append(self, data: bytes, lines: int, last_seq: int) -> None:
        """Write ``lines`` commit lines (``data``, the last op's seq ``last_seq``) at the end of
        the data: into the padding, or growing it (``framing.PAD_MIN``; ``none``: no padding).

        Raises:
            StorageIOError: the write failed; file and index may now disagree, so every later
                append raises StorageError until the session is reopened.
        """
        fd = self._live_fd()
        if self._write_error is not None:
            raise self._write_error
        offset, end = self.end, self.end + len(data)
        try:
            if end <= self._size or self.durability == "none":
                _pwrite_all(fd, data, offset)
                self._size = max(self._size, end)
            else:  # grow: the lines plus fresh padding in one write
                pad = min(PAD_MAX, max(PAD_MIN, end))
                _pwrite_all(fd, data + PAD * pad, offset)
                self._size = end + pad
        except OSError as exc:
            self._write_error = StorageError(
                f"session file {self.path}: a write failed ({exc}); reopen the session to "
                "continue from what reached the file"
            )
            raise translate(exc, self.path) from exc
        self.end = end
        self.written += lines
        self.written_seq = last_seq

    def barrier(self) -> None:
        """``fdatasync``: every line written before the call is durable (the one sync of the
        write path). Traced for power-cut tests (``barrier_trace.py``) and timed as
        ``"fsync"`` for :mod:`~durable_harness.storage.timing` only when those are on.

        Raises:
            StorageIOError: the fsync failed.
        """
        fd, trace, end, mark = self._live_fd(), self._trace, self.end, self.marked
        started = timing.start()
        try:
            os.fdatasync(fd)
            timing.since("fsync", started)
            if trace is not None:
                trace.record(end, mark)
        except OSError as exc:
            raise translate(exc, self.path) from exc

    def sync(self) -> int:
        """:meth:`barrier`, then move the mark; return how many lines it made durable."""
        covered, seq = self.written, self.written_seq
        self.barrier()
        self.set_mark(seq)
        return covered

    def set_mark(self, seq: int) -> None:
        """Move the high-water mark to ``seq``, just made durable: one ``pwrite`` into line 1,
        durable with the next fsync (``design/storage.md``, "The high-water mark")."""
        at, fd = self._mark_at, self._fd
        if at is None or fd is None or seq <= self.marked:
            return
        with self._mark_lock:
            if seq <= self.marked:
                return
            try:
                os.pwrite(fd, mark_text(seq).encode(), at)
            except OSError:  # the commit is durable; a lagging mark only claims less
                return
            self.marked = seq

    # -- reading, closing --------------------------------------------------------------------
    def read(self, length: int, offset: int) -> bytes:
        """``length`` bytes at ``offset``."""
        try:
            return os.pread(self._live_fd(), length, offset)
        except OSError as exc:
            raise translate(exc, self.path) from exc

    def lease_holder(self) -> dict[str, Any] | None:
        """The live holder of the writer lease (see :meth:`FileLease.probe`), or ``None``."""
        with storage_boundary(self.path):
            return (self._lease or FileLease(self.path + ".lock", self.path)).probe()

    def close(self) -> None:
        """Make the mark exact on disk (one fsync, if it moved since the last; ``none`` mode
        moves it here only: a ``pwrite`` per commit costs a quarter of one), cut the padding
        off while this writer holds the lease and the padding is intact (never lines a newer
        writer put over it), then :meth:`release`. Idempotent."""
        fd, lease = self._fd, self._lease
        try:
            if fd is None or lease is None:
                return
            if self._write_error is None:
                with suppress(StorageError):  # stale, or the fsync failed: the mark claims less
                    self.check_lease()  # a fenced writer must not touch the file
                    if self.durability == "none":
                        self.set_mark(self.written_seq)
                    elif self.marked > self._mark_synced:
                        self.barrier()
                        self._mark_synced = self.marked
            with storage_boundary(self.path), suppress(StaleGeneration):
                if self._size > self.end:
                    lease.check()
                    size, padding = os.fstat(fd).st_size, self._size - self.end
                    if size == self._size and not os.pread(fd, padding, self.end).strip(PAD):
                        os.ftruncate(fd, self.end)
        finally:
            self.release()

    def release(self) -> None:
        """Close the file, the trace and the lease as they are. Idempotent."""
        fd, trace, lease = self._fd, self._trace, self._lease
        self._fd = self._trace = self._lease = None
        with storage_boundary(self.path):
            try:
                if fd is not None:
                    os.close(fd)
                if trace is not None:
                    trace.close()
            finally:
                if lease is not None:
                    lease.release()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` or :meth:`release` ran."""
        return self._fd is None

    def _live_fd(self) -> int:
        if self._fd is None:
            raise SessionClosed(f"session file {self.path} is closed")
        return self._fd


def _new_file(path: str, data: bytes, flags: int) -> int:
    """Create ``path`` exclusively (0600) holding ``data``, fsynced; return its descriptor.
    A failure leaves no file (``FileExistsError`` when it exists)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        private_fd(fd)
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` all of ``data`` at byte ``offset``, looping on short writes."""
    written = os.pwrite(fd, data, offset)
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)
