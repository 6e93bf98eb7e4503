"""JSON encoding for session files and rows: orjson, with lone surrogates written and read as U+FFFD
(``design/storage.md`` "The JSONL file, line by line"; the ``replaced_surrogate`` damage kind)."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings and keys replaced by U+FFFD (itself
    when none)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    return _scrub(value)


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


def dumps_held(value: Any, *, line: bool = False) -> tuple[bytes, Any]:
    """:func:`dumps` (with ``line``: plus ``\n``), and the value the bytes hold: ``value``, or its
    scrubbed copy (what a store keeping committed values in memory must keep).

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
    """
    option = orjson.OPT_APPEND_NEWLINE if line else None
    try:
        return orjson.dumps(value, option=option), value
    except orjson.JSONEncodeError as exc:
        if "surrogates" not in str(exc) and "str is not valid UTF-8" not in str(exc):
            raise TypeError(str(exc)) from exc
        clean = _scrub(value)
        return orjson.dumps(clean, option=option), clean


# One JSON escape per match, left to right, so an escaped backslash (``\\``) is consumed whole
# and never read as the start of a ``\u`` escape. ``high`` is a high half, ``low`` the low half
# right after it (a valid pair); ``lone`` is a low half with no high half before it; any other
# escape matches the last branch and is kept as is.
_ESCAPE = re.compile(
    rb"\\(?:u(?P<high>[dD][89abAB][0-9a-fA-F]{2})(?P<low>\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|(?P<lone>u[dD][c-fC-F][0-9a-fA-F]{2})|.)",
    re.S,
)
_REPLACEMENT = rb"\ufffd"


def repair_surrogates(data: bytes) -> tuple[bytes, int]:
    """``(data, count)`` with every lone surrogate escape in the JSON text rewritten as ``\ufffd``
    (a valid pair and raw bytes are kept); ``count`` 0 returns ``data`` itself."""
    if b"\\u" not in data:
        return data, 0
    count = 0

    def fix(m: re.Match[bytes]) -> bytes:
        nonlocal count
        if m["lone"] is None and (m["high"] is None or m["low"] is not None):
            return m[0]  # a valid pair or any other escape
        count += 1
        return _REPLACEMENT

    fixed = _ESCAPE.sub(fix, data)
    return (fixed, count) if count else (data, 0)


def loads_counted(data: bytes | str) -> tuple[Any, int]:
    """Decode JSON like :func:`loads`; also return how many lone surrogates became U+FFFD.

    Raises:
        orjson.JSONDecodeError: ``data`` is not JSON, or is bad for another reason than a lone
            surrogate (a ``ValueError``).
    """
    try:
        return orjson.loads(data), 0
    except orjson.JSONDecodeError as exc:
        if "surrogate" not in str(exc):
            raise
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        fixed, count = repair_surrogates(raw)
        if not count:
            raise
        return orjson.loads(fixed), count


def loads(data: bytes | str) -> Any:
    """Decode JSON, reading a lone surrogate escape as U+FFFD.

    Raises:
        orjson.JSONDecodeError: (a ``ValueError``) ``data`` is not JSON.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads_counted(data)[0]


def lone_surrogate_paths(data: bytes) -> list[tuple[str | int, ...]]:
    """The paths (keys and list indexes from the root) to strings or keys of the JSON text ``data``
    holding a lone surrogate; ``[]`` when it does not decode. Slow (the standard decoder)."""
    try:
        value = json.loads(data)
    except ValueError:
        return []
    found: list[tuple[str | int, ...]] = []

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if isinstance(node, str):
            if _SURROGATE.search(node):
                found.append(path)
        elif isinstance(node, dict):
            for key, item in node.items():
                if _SURROGATE.search(key):
                    found.append((*path, key))
                walk(item, (*path, key))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, (*path, i))

    walk(value, ())
    return found


def format_path(path: tuple[str | int, ...]) -> str:
    """A path from :func:`lone_surrogate_paths` as ``message.content[0].text``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + _SURROGATE.sub("\ufffd", part)
    return out or "(the value)"
