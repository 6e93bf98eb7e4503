"""JSON encoding for session files and rows: orjson, with lone surrogates made safe.

orjson refuses ``str`` values holding lone UTF-16 surrogates (which Python strings can carry,
e.g. from ``surrogateescape`` decoding). Such text is rewritten with U+FFFD before encoding so a
write never fails halfway and the file stays valid UTF-8. U+2028, U+2029 and U+0085 are written
raw: lines are split on ``\\n`` only.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON (no trailing newline).

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if "surrogates" not in str(exc) and "str is not valid UTF-8" not in str(exc):
            raise TypeError(str(exc)) from exc
        return orjson.dumps(_scrub(value))


def dumps_line(value: Any) -> bytes:
    """:func:`dumps` plus a trailing ``\\n``: one JSONL line, encoded in one pass."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return dumps(value) + b"\n"


def loads(data: bytes | str) -> Any:
    """Decode JSON; raises ``orjson.JSONDecodeError`` (a ``ValueError``) on bad input."""
    return orjson.loads(data)
