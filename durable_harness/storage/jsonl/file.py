"""One session file as an object that owns its state: the descriptor and the writer lease, the
write into the padding, the barrier, the high-water mark, the quarantine of a torn tail and the
takeover (``design/storage.md``). Every system call on the file is made here, inside an
explicit boundary: an ``OSError`` leaves as a typed error naming the file
(:func:`~durable_harness.storage.oserrors.translate`)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from durable_harness.errors import (
    CorruptSession,
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
    """An open session file: :meth:`open` (then :meth:`begin`) or :meth:`create`.

    Attributes:
        path: the file. durability: the :data:`~durable_harness.storage.base.Durability` mode.
        end: where the next commit line goes (the end of the data).
        written: commit lines written since the open; written_seq: the last seq written.
        marked: the seq the high-water mark in line 1 holds.
    """

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
        """Create ``path`` exclusively (mode 0600) holding line 1 only, durably (the file and
        its name in the folder).

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
        """The file's whole content, read now.

        Raises:
            SessionUnreadable: a read failed.
        """
        fd = self._live_fd()
        chunks: list[bytes] = []
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            while chunk := os.read(fd, 1 << 22):
                chunks.append(chunk)
        except OSError as exc:
            raise unreadable_error(self.path, exc) from exc
        return b"".join(chunks)

    def begin(self, scan: Scan, data: bytes) -> int:
        """Carry on from ``scan`` of ``data`` (this file's bytes): the end of the data and the
        mark. A writable open also raises its lease generation past every generation in the
        data, counts the commits lost past the mark (the next commit is numbered past it, so
        the hole stays visible), quarantines a torn tail, moves the file to a new inode when
        the lease was contested (:meth:`_detach`) and starts the barrier trace if one is on.
        Returns this writer's generation (0 when read-only)."""
        self.end, self._mark_at, self.marked = scan.end, scan.mark_at, scan.mark or 0
        if self._lease is None:
            return 0
        fd = self._live_fd()
        with storage_boundary(self.path):
            generation = self._lease.raise_floor(scan.generation)
            self.written_seq = self._mark_synced = self.marked = max(scan.seq, self.marked)
            if scan.torn is not None:
                side = self._quarantine(*scan.torn)
                for item in scan.damage:
                    if item["kind"] == "torn_tail":
                        item["quarantined_to"] = side
            self._size = os.fstat(fd).st_size
            if self._lease.contested:
                self._detach(data[: self.end])
            self._trace = open_trace(self.path)
            if self._trace is not None:  # the trace starts here: the file as found is durable
                self._trace.record(self.end, self.marked)
        return generation

    def _quarantine(self, offset: int, tail: bytes) -> str:
        """Move a torn final line (never acknowledged) to ``<path>.torn-<offset>`` and cut it
        off; return the side file's path."""
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
        """Move the session to a new inode holding ``content`` (the data, without padding).

        Called when the lease was taken from a writer that may still be alive (a broken lease,
        a removed or reset lock file). That writer checks the lease before each write, but a
        write can still slip in between its check and our takeover; its file descriptor now
        points at the old inode, so such a write, and a trim at its close, land there and can
        never overwrite or cut a line of ours. Costs one copy of the file, once per takeover.
        """
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
        """Refuse to write once another writer took the lease (one ``fstat``).

        Raises:
            StaleGeneration: another writer took the lease. SessionClosed: closed.
        """
        self._live_fd()
        try:
            if self._lease is not None:
                self._lease.check()
        except OSError as exc:
            raise translate(exc, self.path) from exc

    def append(self, data: bytes, lines: int, last_seq: int) -> None:
        """Write ``lines`` whole commit lines (``data``; the last op's seq ``last_seq``) at the
        end of the data: inside the padding, or growing the file by the lines plus fresh
        padding in one write (``none`` mode: no padding).

        Raises:
            StorageIOError: the write failed. The file and the index may now disagree, so
                every later append is refused (StorageError) until the session is reopened.
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
        """``fdatasync`` the file: every line written before the call is then durable.

        The one place the write path syncs the file. With a barrier trace open (power-cut tests,
        :mod:`durable_harness.storage.barrier_trace`) it then records the data length and the
        mark the sync covered, both read before the call; otherwise that costs one ``is None``
        test. With a :mod:`~durable_harness.storage.timing` observer registered (the host's
        metrics) the sync is timed and reported as ``"fsync"``; otherwise the clock is not read.

        Raises:
            StorageIOError: the fsync failed.
        """
        fd, trace = self._live_fd(), self._trace
        try:
            if trace is None and not timing.enabled():
                os.fdatasync(fd)
                return
            end, mark = self.end, self.marked
            started = time.perf_counter()
            os.fdatasync(fd)
            timing.observe("fsync", time.perf_counter() - started)
            if trace is not None:
                trace.record(end, mark)
        except OSError as exc:
            raise translate(exc, self.path) from exc

    def sync(self) -> int:
        """:meth:`barrier`, then move the mark to the last seq it covered; return the number
        of lines written when it started (all of them durable now)."""
        covered, seq = self.written, self.written_seq
        self.barrier()
        self.set_mark(seq)
        return covered

    def set_mark(self, seq: int) -> None:
        """Move the high-water mark to ``seq``, which the caller has just made durable.

        Written after the fsync that made ``seq`` durable, never before, so the mark never
        claims a commit that is not on disk; it reaches the disk itself with the next fsync of
        the file (the next barrier, or :meth:`close`). One ``pwrite`` of 29 bytes into line 1;
        no fsync of its own (``design/storage.md`` has the argument and the cost).
        """
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
        """``length`` bytes at ``offset`` (one commit line).

        Raises:
            CorruptSession: the file is closed. StorageIOError: the read failed.
        """
        if self._fd is None:
            raise CorruptSession(f"session file {self.path} is closed")
        try:
            return os.pread(self._fd, length, offset)
        except OSError as exc:
            raise translate(exc, self.path) from exc

    def lease_holder(self) -> dict[str, Any] | None:
        """The live holder of the writer lease (see :meth:`FileLease.probe`), or ``None``."""
        with storage_boundary(self.path):
            return (self._lease or FileLease(self.path + ".lock", self.path)).probe()

    def close(self) -> None:
        """Make the mark's last move durable, cut the padding off, close the file, the trace
        and the lease. Idempotent."""
        try:
            if self._fd is not None and self._lease is not None:
                self._sync_mark()
                with storage_boundary(self.path):
                    self._trim_padding(self._fd, self._lease)
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

    def _sync_mark(self) -> None:
        """At close: make the mark's last move durable (one fsync, only when it moved since the
        last fsync of the file), so a closed session's mark is exact on disk. In ``none`` mode
        (no fsync ever) the mark moves here only, to the last seq written: a ``pwrite`` per
        commit would cost a quarter of such a commit (``bench/``)."""
        if self._write_error is not None:
            return
        try:
            self.check_lease()  # a fenced writer must not touch the file
            if self.durability == "none":
                self.set_mark(self.written_seq)
            elif self.marked > self._mark_synced:
                self.barrier()
                self._mark_synced = self.marked
        except StorageError:  # StaleGeneration, or the fsync failed: the mark only claims less
            return

    def _trim_padding(self, fd: int, lease: FileLease) -> None:
        """Cut the preallocated padding off at close (the file is valid with or without it).

        Only while this writer still holds the lease and the padding is intact: a stale writer
        must never cut into lines a newer writer wrote over its padding.
        """
        if self._size <= self.end:
            return
        try:
            lease.check()
        except StaleGeneration:
            return
        if os.fstat(fd).st_size == self._size and not os.pread(
            fd, self._size - self.end, self.end
        ).strip(PAD):
            os.ftruncate(fd, self.end)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` or :meth:`release` ran."""
        return self._fd is None

    def _live_fd(self) -> int:
        if self._fd is None:
            raise SessionClosed(f"session file {self.path} is closed")
        return self._fd


def _new_file(path: str, data: bytes, flags: int) -> int:
    """Create ``path`` exclusively (mode 0600) holding ``data``, fsynced; return its open
    descriptor. A failure leaves no file behind.

    Raises:
        FileExistsError: ``path`` exists. OSError: the file cannot be made or written.
    """
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
