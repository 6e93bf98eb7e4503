"""Identifiers: UUIDv7 for sessions and runs, random 16-hex ids for entries and records, and
the one pattern a session id follows (:data:`SESSION_ID_PATTERN`)."""

from __future__ import annotations

import os
import random
import re
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


def new_id() -> str:
    """Return a random 64-bit entry or record id as 16 lowercase hex characters, from
    :mod:`random` (seeded from ``os.urandom``, reseeded in a fork): unique, not secret, and no
    system call per id."""
    return f"{random.getrandbits(64):016x}"


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
