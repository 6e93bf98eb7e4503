"""Framing of a JSONL session file: the line format, the shape of a commit line, the padding
that preallocates the file, and the low-level reads and writes (``design/storage.md``)."""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any

from durable_harness.ids import SESSION_ID_PATTERN
from durable_harness.models.header import FORMAT as FORMAT
from durable_harness.models.header import is_own_format as is_own_format
from durable_harness.models.header import new_header
from durable_harness.storage import codec, timing
from durable_harness.storage.base import unreadable_error

if TYPE_CHECKING:
    from durable_harness.storage.jsonl.store import JsonlSessionStore

PAD = b"\n"
PAD_MIN = 64 * 1024
PAD_MAX = 1024 * 1024
"""Preallocation (``sync`` and ``batch``): the file is grown ahead of the data by a run of
empty lines, ``PAD_MIN`` to ``PAD_MAX`` bytes (as much as the data, within those bounds), and
each commit line overwrites the start of that run. An ``fdatasync`` that does not change the
file's size has no metadata to journal: measured 73 µs against 118 µs for an append of the
same 600-byte line on the development machine. Readers skip empty lines; ``close`` cuts the
padding off. See ``design/storage.md``."""


def commit_line(generation: int, numbered: list[dict[str, Any]]) -> bytes:
    """The line of one commit: ``{"gen": generation, "ops": numbered}`` and its ``\\n``. Where
    an op held lone surrogates the line holds U+FFFD instead, and so do the ops of ``numbered``
    (replaced in place), so the index keeps what the file holds (:func:`codec.dumps_held`).

    Raises:
        TypeError: an op holds something JSON cannot represent.
    """
    payload = {"gen": generation, "ops": numbered}
    line, held = codec.dumps_held(payload, line=True)
    if held is not payload:
        numbered[:] = held["ops"]
    return line


def op_seq(op: dict[str, Any]) -> int:
    """The seq of one op of a commit line (an entry's, a record's or a lane op's own)."""
    body = op.get("entry") or op.get("record") or op
    return int(body["seq"])


def is_commit_line(obj: dict[str, Any]) -> bool:
    """True when a parsed line is a commit line (``{"gen", "ops": [...]}``), not a header."""
    return isinstance(obj.get("ops"), list) and obj.get("type") is None


def shape_error(kind: str, op: dict[str, Any], body: dict[str, Any]) -> str | None:
    """Return why a parsed op cannot be indexed (a field of the wrong type), or ``None``.

    A single writer never produces these; they come from damage and are reported, not raised.
    """

    def opt_str(value: Any) -> bool:
        return value is None or isinstance(value, str)

    if kind == "entry" and not (opt_str(op.get("lane")) and opt_str(body.get("parentId"))):
        return "lane and parentId must be strings or null"
    if kind == "record" and not (opt_str(body.get("lane")) and opt_str(body.get("runId"))):
        return "lane and runId must be strings or null"
    if kind == "lane":
        if not isinstance(op.get("lane"), str):
            return "lane must be a string"
        if not opt_str(op.get("leafId")):
            return "leafId must be a string or null"
        if op.get("config") is not None and not isinstance(op.get("config"), dict):
            return "config must be an object"
    return None


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` all of ``data`` at byte ``offset``, looping on short writes.

    Raises:
        OSError: a write failed.
    """
    written = os.pwrite(fd, data, offset)
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)


def write_all(fd: int, data: bytes) -> None:
    """``write`` all of ``data`` at the file position, looping on short writes.

    Raises:
        OSError: a write failed.
    """
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def open_and_read(path: str, flags: int) -> tuple[int, bytes]:
    """Open ``path`` with ``flags`` and read it whole; return the open fd and the bytes.

    Raises:
        SessionUnreadable: the file cannot be opened or read (permissions, I/O error...).
    """
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        what = "cannot be opened for writing" if flags & os.O_RDWR else "cannot be read"
        raise unreadable_error(path, exc, what=what) from exc
    try:
        return fd, read_all(fd)
    except OSError as exc:
        os.close(fd)
        raise unreadable_error(path, exc) from exc
    except BaseException:
        os.close(fd)
        raise


def read_all(fd: int) -> bytes:
    """Read ``fd`` from its position to the end.

    Raises:
        OSError: a read failed.
    """
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 22)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


NAME_ID = re.compile(rf"_({SESSION_ID_PATTERN})\.jsonl$")


def recover_header(path: str, header: Any, rest: bytes) -> dict[str, Any] | None:
    """A stand-in header for a session file whose line 1 is damaged, when the file is still
    recognisably ours (the next line is a commit line and the name ends ``_<id>.jsonl``):
    losing one header byte must not make a session, and an in-doubt run in it, disappear."""
    match = NAME_ID.search(os.path.basename(path))
    line = rest.split(b"\n", 1)[0]
    try:
        commit = codec.loads(line) if line.strip() else None
    except ValueError:
        commit = None
    if match is None or not (isinstance(commit, dict) and is_commit_line(commit)):
        return None
    old = header if isinstance(header, dict) else {}
    cwd, stamp = old.get("cwd"), str(old.get("timestamp", ""))
    cwd = cwd if isinstance(cwd, str) else ""
    return new_header(match.group(1), stamp, cwd, extra={"headerDamaged": True})


def barrier(store: JsonlSessionStore) -> None:
    """``fdatasync`` the session file: every line written before the call is then durable.

    The one place the write path syncs the file. With a barrier trace open (power-cut tests,
    :mod:`durable_harness.storage.barrier_trace`) it then records the data length and the mark
    the sync covered, both read before the call; otherwise that costs one ``is None`` test.
    With a :mod:`~durable_harness.storage.timing` observer registered (the host's metrics) the
    sync is timed and reported as ``"fsync"``; otherwise the clock is not read.

    Raises:
        OSError: the fsync failed.
    """
    fd = store._fd
    assert fd is not None
    trace = store._trace
    if trace is None and not timing.enabled():
        os.fdatasync(fd)
        return
    end, mark = store._end, store._marked
    started = time.perf_counter()
    os.fdatasync(fd)
    timing.observe("fsync", time.perf_counter() - started)
    if trace is not None:
        trace.record(end, mark)
