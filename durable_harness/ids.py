"""Identifiers: UUIDv7 for sessions and runs, 16-hex ids for entries and records (a counter
and a random per-process tag), and the one pattern a session id follows
(:data:`SESSION_ID_PATTERN`)."""

from __future__ import annotations

import itertools
import os
import re
import struct
import threading
import time
import uuid

SESSION_ID_PATTERN = r"[0-9A-Za-z][0-9A-Za-z._-]{0,127}"
"""What a session id looks like (no path separator, no leading dot, no control character): the
ids :func:`uuid7` mints, the JSONL store accepts, the host checks and the HTTP API's paths show,
so any session the library makes is reachable through them."""

SESSION_ID = re.compile(SESSION_ID_PATTERN)
""":data:`SESSION_ID_PATTERN` compiled (use ``fullmatch``)."""


def uuid7() -> str:
    """Return a new UUIDv7 string (RFC 9562 section 5.7: 48 bits of Unix milliseconds, version
    7, random bits; ids sort by creation time), e.g. ``0193a1b2-...``."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 68) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


_ID_BLOCK = 1 << 32  # ids one tag serves: the high 32 bits count
# (tag, counter): the low 32 bits, random per process (and per block), and the high 32 bits'
# counter; one tuple, read at once, so no id pairs a counter value with another block's tag
_id_block: tuple[int, itertools.count[int]] = (0, itertools.count())
_id_lock = threading.Lock()


def _new_id_block() -> None:
    """Draw a fresh random 32-bit tag and a random counter start below 2**31 (``os.urandom``):
    at import, in every forked child, and when a tag's counter runs out."""
    global _id_block
    tag, start = struct.unpack(">II", os.urandom(8))
    _id_block = (tag, itertools.count(start >> 1))


_new_id_block()
if hasattr(os, "register_at_fork"):  # POSIX; where processes never fork there is no child
    os.register_at_fork(after_in_child=_new_id_block)


def new_id() -> str:
    """Return a new entry or record id: 16 lowercase hex characters, a 32-bit counter from a
    random start, then a 32-bit tag drawn at random (``os.urandom``) for this process and
    redrawn in a forked child. Unique, not secret, no system call per id.

    The ids a process makes increase, so the rows of a session that a SQL store keys by
    ``(session_id, id)`` are appended at the end of its range instead of at random places in
    it: a commit dirties fewer B-tree pages (``design/storage.md``, "Ids and pages"). The first
    8 characters are the counter, so they alone name one id of this process (the short prefix
    the CLI accepts; consecutive ids share their first 6 or 7). Two processes repeat an id only
    with the same counter value and the same 32-bit tag; a repeat within a session is refused
    by every store (``IdConflict``), never written over."""
    tag, count = _id_block
    n = next(count)
    while n >= _ID_BLOCK:  # after about two billion ids: a new tag (once per block)
        with _id_lock:
            if _id_block[1] is count:
                _new_id_block()
            tag, count = _id_block
        n = next(count)
    return (n << 32 | tag).to_bytes(8, "big").hex()  # (twice as fast as a format spec)


_second: tuple[int, str] = (-1, "")  # the last whole second formatted by now_iso
_milli: tuple[int, str] = (-1, "")  # the last millisecond it returned, and what


def now_iso() -> str:
    """Return the current UTC time as ISO 8601 with milliseconds and ``Z`` (pi's format); the
    seconds part is formatted once per second, the whole once per millisecond (a turn stamps
    about 7 records and entries, most within the same millisecond)."""
    global _second, _milli
    ms = time.time_ns() // 1_000_000
    last = _milli
    if last[0] == ms:
        return last[1]
    seconds, millis = divmod(ms, 1000)
    cached = _second
    if cached[0] != seconds:
        cached = _second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    text = f"{cached[1]}.{millis:03d}Z"
    _milli = (ms, text)
    return text


def iso_from_ns(ns: int) -> str:
    """Return a Unix time in nanoseconds (a file's ``st_mtime_ns``) as ISO 8601 UTC with
    milliseconds and ``Z``: the format of :func:`now_iso`."""
    seconds, millis = divmod(ns // 1_000_000, 1000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{millis:03d}Z"


def now_ms() -> int:
    """Return the current Unix time in milliseconds."""
    return time.time_ns() // 1_000_000
