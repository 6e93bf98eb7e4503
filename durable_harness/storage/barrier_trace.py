"""Barrier bookkeeping for power-cut tests: what a store's own fsyncs made durable, traced only when
:data:`TRACE_ENV` names a folder (``design/crash-matrix.md`` "Power cuts")."""

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
    """The trace file in ``folder`` for the store file at ``path``."""
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:24]
    return os.path.join(folder, f"{digest}.json")


@dataclass
class BarrierTrace:
    """The open trace file of one store file."""

    path: str
    fd: int

    def record(self, length: int, mark: int = 0, salt: str = "") -> None:
        """Rewrite the trace (one ``pwrite``, fixed size: never a mix): the barrier just completed
        covered ``length`` bytes, with the JSONL ``mark`` and the WAL ``salt`` of its start."""
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
    """``(end of the last valid commit frame, salts as hex)`` of a SQLite WAL file (``(0, "")``
    without one); a frame is valid while it repeats the header's salts."""
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
