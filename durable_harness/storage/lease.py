"""The single-writer lease of the file backends: an exclusive ``flock`` on a lock file (JSON
``{"pid", "host", "generation", "acquiredAt", "broken"}``) plus a fencing generation
(``design/storage.md`` "The lease")."""

from __future__ import annotations

import fcntl
import os
import socket
from typing import Any

from durable_harness.errors import LeaseHeld, StaleGeneration, StorageError
from durable_harness.ids import now_iso
from durable_harness.storage import codec
from durable_harness.storage.private import private_fd


class FileLease:
    """A writer lease on ``lock_path`` (created ``0600``).

    Attributes:
        generation: this holder's fencing generation (a positive int once acquired).
    """

    def __init__(self, lock_path: str, what: str) -> None:
        self.lock_path = lock_path
        self.what = what
        self.generation = 0
        self.contested = False  # True when another writer may still be alive (see acquire)
        self._fd: int | None = None

    def _read(self, fd: int) -> dict[str, Any]:
        raw = os.pread(fd, 4096, 0)
        try:
            data = codec.loads(raw) if raw.strip() else {}
        except ValueError:
            data = {}
        return data if isinstance(data, dict) else {}

    def acquire(self, *, break_lease: bool = False, floor: int = 0) -> int:
        """Take the lease and return the new generation (``max(old, floor) + 1``); :attr:`contested`
        when a live holder was displaced (``break_lease``).

        Raises:
            LeaseHeld: a live process holds it and ``break_lease`` is False.
        """
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(
                f"{self.what}: cannot open its lock file {self.lock_path}: {exc.strerror}",
                path=self.lock_path,
            ) from exc
        try:
            private_fd(fd)
        except OSError:
            os.close(fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            locked = False
            if not break_lease:
                holder = self._read(fd)
                os.close(fd)
                raise LeaseHeld(
                    f"{self.what} is open for writing by another live process "
                    f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}, generation "
                    f"{holder.get('generation', '?')}); open it read-only or stop that process",
                    holder_pid=holder.get("pid"),
                    generation=holder.get("generation"),
                ) from None
        old = self._read(fd).get("generation", 0)
        old = old if isinstance(old, int) and not isinstance(old, bool) and old > 0 else 0
        self._fd = fd
        self.contested = not locked
        self._write(max(old, floor) + 1, broken=not locked)
        return self.generation

    def raise_floor(self, floor: int) -> int:
        """Make the held generation exceed ``floor`` (the highest found in the data); having to sets
        :attr:`contested` (the lock file was lost, its writer may be alive)."""
        if self._fd is not None and self.generation <= floor:
            self.contested = True
            self._write(floor + 1, broken=False)
        return self.generation

    def _write(self, generation: int, *, broken: bool) -> None:
        fd = self._fd
        assert fd is not None
        self.generation = generation
        body = codec.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "generation": self.generation,
                "acquiredAt": now_iso(),
                "broken": broken,
            }
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, body, 0)
        os.fsync(fd)
        self._stamp = self._stat(fd)

    @staticmethod
    def _stat(fd: int) -> tuple[int, int, int, int]:
        st = os.fstat(fd)
        return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino

    def probe(self) -> dict[str, Any] | None:
        """Return the live holder's lock-file content, or ``None`` (takes and drops the flock)."""
        if self._fd is not None:
            return {"pid": os.getpid(), "generation": self.generation, "self": True}
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._read(fd) or {"pid": None}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    _stamp: tuple[int, int, int, int] = (0, 0, 0, 0)

    def check(self) -> None:
        """Raise :class:`StaleGeneration` if another writer took the lease since we did: one
        ``fstat`` unless the lock file's stamp changed (then its inode and generation are
        checked)."""
        if self._fd is None or self._stat(self._fd) == self._stamp:
            return  # unlinking or replacing the lock file changes its ctime: never missed here
        try:
            inode = os.stat(self.lock_path).st_ino
        except OSError:
            inode = None
        if inode != self._stamp[3]:
            raise StaleGeneration(
                f"{self.what}: the lock file {self.lock_path} was removed or replaced while this "
                "writer held it; another writer may have started, so the append was refused",
                generation=self.generation,
            )
        value = self._read(self._fd).get("generation", 0)
        current = value if isinstance(value, int) and not isinstance(value, bool) else -1
        if current != self.generation:
            raise StaleGeneration(
                f"{self.what}: this writer holds generation {self.generation} but the lease is "
                f"now at generation {current}; the append was refused",
                generation=self.generation,
                current=current,
            )

    def release(self) -> None:
        """Drop the flock and close the lock file. Idempotent."""
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None
