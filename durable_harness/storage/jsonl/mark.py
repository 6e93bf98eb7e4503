"""The durable high-water mark in line 1 of a session file: its fixed-width text, how it is
parsed, moved after an fsync, and made durable at close (``design/storage.md``, "The
high-water mark")."""

from __future__ import annotations

import os
import re
import zlib
from typing import TYPE_CHECKING

from durable_harness.errors import StaleGeneration
from durable_harness.storage.jsonl.framing import barrier

if TYPE_CHECKING:
    from durable_harness.storage.jsonl.store import JsonlSessionStore


MARK_KEY = "durableSeq"
"""The header field holding the durable high-water mark: the highest seq known durable, kept
in line 1 so that cutting lines off the end of the file cannot erase it (``design/storage.md``,
"The high-water mark"). Fixed width, rewritten in place with one ``pwrite``."""
_MARK_FIELD = b'"' + MARK_KEY.encode() + b'":"'
_MARK_TEXT = re.compile(rb"(\d{20})\.([0-9a-f]{8})")
MARK_LEN = 29


def mark_text(seq: int) -> str:
    """The mark's fixed-width text: 20 decimal digits, ``.``, their CRC-32 in 8 hex digits (a
    write torn by a power cut leaves digits that fail the CRC instead of a wrong number)."""
    digits = f"{seq:020d}"
    return f"{digits}.{zlib.crc32(digits.encode()):08x}"


def parse_mark(first_line: bytes) -> tuple[int | None, int | None]:
    """Find the mark in a header line: ``(byte offset of its text or None, seq or None)``;
    the seq is ``None`` when the field is absent or its text fails the check."""
    at = first_line.find(_MARK_FIELD)
    if at < 0:
        return None, None
    at += len(_MARK_FIELD)
    match = _MARK_TEXT.fullmatch(first_line[at : at + MARK_LEN])
    if match is None or int(match.group(2), 16) != zlib.crc32(match.group(1)):
        return at, None
    return at, int(match.group(1))


def set_mark(store: JsonlSessionStore, seq: int) -> None:
    """Move the high-water mark to ``seq``, which the caller has just made durable.

    Written after the fsync that made ``seq`` durable, never before, so the mark never
    claims a commit that is not on disk; it reaches the disk itself with the next fsync of
    the file (the next barrier, or :meth:`close`). One ``pwrite`` of 29 bytes into line 1;
    no fsync of its own (``design/storage.md`` has the argument and the cost).
    """
    at, fd = store._mark_at, store._fd
    if at is None or fd is None or seq <= store._marked:
        return
    with store._mark_lock:
        if seq <= store._marked:
            return
        try:
            os.pwrite(fd, mark_text(seq).encode(), at)
        except OSError:  # the commit is durable; a lagging mark only claims less
            return
        store._marked = seq


def sync_mark(store: JsonlSessionStore) -> None:
    """At close: make the mark's last move durable (one fsync, only when it moved since the
    last fsync of the file), so a closed session's mark is exact on disk. In ``none`` mode
    (no fsync ever) the mark moves here only, to the last seq written: a ``pwrite`` per
    commit would cost a quarter of such a commit (``bench/``)."""
    fd = store._fd
    if fd is None or store.read_only or store._write_error is not None:
        return
    try:
        if store._lease is not None:
            store._lease.check()  # a fenced writer must not touch the file
        if store.durability == "none":
            set_mark(store, store._written_seq)
        elif store._marked > store._mark_synced:
            barrier(store)
            store._mark_synced = store._marked
    except (OSError, StaleGeneration):
        return
