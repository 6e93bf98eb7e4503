"""Barrier bookkeeping for power-cut tests: what a store's own fsyncs made durable.

Only when :data:`TRACE_ENV` names a folder (the crash matrix's ``--power-cut`` mode sets it in
the child it kills); otherwise :func:`open_trace` returns ``None`` and a store pays one ``is
None`` test per fsync (``design/crash-matrix.md``, "Power cuts", has the measurement).

A trace is one small file per store file in that folder, rewritten in place with one
``pwrite`` after each completed barrier: ``{"path", "length", "mark", "salt"}``. ``length`` is
the byte length the barrier covered (JSONL: the end of the data when the ``fdatasync`` started;
SQLite: the end of the WAL's last commit frame then), ``mark`` the JSONL high-water mark that
was in line 1 when it started (the mark moved after a barrier reaches the disk with the next
one), ``salt`` the WAL's salts (a WAL restarted since has none of its frames durable).
:func:`durable_harness.crashtest.powercut.cut` reads it to cut the store back.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

TRACE_ENV = "DURABLE_HARNESS_BARRIER_TRACE"
_RECORD_SIZE = 4096
WAL_HEADER = 32
WAL_FRAME_HEADER = 24


def trace_file(folder: str, path: str) -> str:
    """The trace file in ``folder`` for the store file at ``path`` (named by a hash of its
    absolute path)."""
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:24]
    return os.path.join(folder, f"{digest}.json")


@dataclass
class BarrierTrace:
    """The open trace file of one store file. :meth:`record` after each barrier."""

    path: str
    fd: int

    def record(self, length: int, mark: int = 0, salt: str = "") -> None:
        """Rewrite the trace: the barrier that just completed covered ``length`` bytes (see
        the module docstring for ``mark`` and ``salt``). One ``pwrite`` of a fixed-size
        record: a SIGKILL leaves the previous record or this one, never a mix."""
        body = json.dumps({"path": self.path, "length": length, "mark": mark, "salt": salt})
        os.pwrite(self.fd, body.encode().ljust(_RECORD_SIZE), 0)

    def close(self) -> None:
        """Close the trace file (the record stays)."""
        os.close(self.fd)


def open_trace(path: str) -> BarrierTrace | None:
    """The trace of the store file at ``path`` when :data:`TRACE_ENV` is set, else ``None``.

    Raises:
        OSError: the trace folder cannot be written.
    """
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    fd = os.open(trace_file(folder, path), os.O_RDWR | os.O_CREAT, 0o600)
    return BarrierTrace(os.path.abspath(path), fd)


def read_trace(folder: str, path: str) -> dict[str, Any] | None:
    """The last record traced for the store file at ``path``, or ``None`` when it has none."""
    try:
        with open(trace_file(folder, path), "rb") as fh:
            raw = fh.read().strip()
    except FileNotFoundError:
        return None
    if not raw:
        return None
    record: dict[str, Any] = json.loads(raw)
    return record


def wal_commit_end(wal_path: str) -> tuple[int, str]:
    """Scan a SQLite WAL file: ``(end of its last valid commit frame, its salts as hex)``.

    A frame is valid while its header repeats the WAL header's salts (the format in
    https://www.sqlite.org/fileformat2.html#walformat); a restarted WAL rewrites the header with
    new salts, so frames of the earlier generation after the end are ignored. ``(0, "")``
    when there is no WAL or no header yet.
    """
    try:
        fd = os.open(wal_path, os.O_RDONLY)
    except FileNotFoundError:
        return 0, ""
    try:
        header = os.pread(fd, WAL_HEADER, 0)
        if len(header) < WAL_HEADER:
            return 0, ""
        page_size = struct.unpack(">I", header[8:12])[0]
        salt = header[16:24]
        frame = WAL_FRAME_HEADER + page_size
        size = os.fstat(fd).st_size
        pos, end = WAL_HEADER, WAL_HEADER
        while pos + frame <= size:
            fh = os.pread(fd, WAL_FRAME_HEADER, pos)
            if len(fh) < WAL_FRAME_HEADER or fh[8:16] != salt:
                break
            pos += frame
            if struct.unpack(">I", fh[4:8])[0] != 0:  # a commit frame: db size after it
                end = pos
        return end, salt.hex()
    finally:
        os.close(fd)
