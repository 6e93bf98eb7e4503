"""What the host takes from a client, checked before it reaches the OS or a store: every
front gets the same :class:`InvalidRequest` (``design/host.md``, "Inputs" and "Roots").
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from durable_harness.errors import CwdNotAllowed, IdempotencyKeyReused, InvalidRequest
from durable_harness.ids import SESSION_ID as SESSION_ID  # re-exported: the manager's check
from durable_harness.ids import SESSION_ID_PATTERN as SESSION_ID_PATTERN  # the HTTP API's

LANE_PATTERN = r"[0-9A-Za-z][0-9A-Za-z._-]{0,127}"
"""What a lane name looks like (no path separator, control character or markup); checked by
:func:`check_lane`, shown by the HTTP models."""

_LANE = re.compile(LANE_PATTERN)

MAX_PATH_BYTES = 4096
"""The longest working directory taken, in bytes of UTF-8 (Linux's ``PATH_MAX``)."""

MAX_NAME_BYTES = 255
"""The longest component of a working directory, in bytes (Linux's ``NAME_MAX``)."""


def _quote(value: str) -> str:
    """``value`` as a message quotes it: ``repr``, cut to 200 characters."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(value)} characters)"


def check_text(name: str, value: str | None) -> None:
    """Refuse a text field holding a NUL or a lone surrogate (:class:`InvalidRequest`)."""
    if value is None:
        return
    if "\x00" in value:
        raise InvalidRequest(f"{name} {_quote(value)} contains a NUL character", field=name)
    check_unicode(name, value)


def check_unicode(name: str, value: str) -> None:
    """Refuse text UTF-8 cannot encode, a lone surrogate (:class:`InvalidRequest`, naming
    the field and the character's position)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"{name} {_quote(value)} is not valid Unicode text: character {exc.start} is a "
            "lone surrogate",
            field=name,
        ) from exc


def working_directory(cwd: str) -> Path:
    """The session directory ``cwd`` names (``~`` expanded): an existing absolute directory
    within :data:`MAX_PATH_BYTES` and :data:`MAX_NAME_BYTES`.

    Raises:
        InvalidRequest: naming ``cwd`` and which rule it breaks (or the OS's reason).
    """
    check_text("cwd", cwd)
    shown = _quote(cwd)
    size = len(cwd.encode("utf-8"))
    if size > MAX_PATH_BYTES:
        raise InvalidRequest(
            f"working directory {shown} is {size} bytes long; the limit is {MAX_PATH_BYTES}",
            cwd=cwd[:200],
        )
    try:
        path = Path(cwd).expanduser() if cwd else None
    except RuntimeError:  # "~nobody/x": no such user's home
        path = None
    if path is not None and any(len(p.encode("utf-8")) > MAX_NAME_BYTES for p in path.parts):
        raise InvalidRequest(
            f"working directory {shown} has a component over {MAX_NAME_BYTES} bytes",
            cwd=cwd[:200],
        )
    try:
        is_dir = path is not None and path.is_absolute() and path.is_dir()
    except OSError as exc:  # ELOOP, EACCES on a parent...
        raise InvalidRequest(
            f"working directory {shown} cannot be used: {os.strerror(exc.errno or 0)}",
            cwd=cwd[:200],
        ) from exc
    if not is_dir or path is None:
        raise InvalidRequest(
            f"working directory {shown} must be an absolute path to an existing directory",
            cwd=cwd[:200],
        )
    return path


def check_root(path: Path, roots: tuple[Path, ...] | None) -> Path:
    """``path``'s real path (symlinks resolved) when it is one of ``roots`` or inside one
    (their real paths too); any path when ``roots`` is ``None`` (``HostOptions.roots``).

    Raises:
        CwdNotAllowed: naming the directory, its real path and the roots.
    """
    real = Path(os.path.realpath(path))
    if roots is None:
        return real
    allowed = [Path(os.path.realpath(root)) for root in roots]
    if any(real == root or real.is_relative_to(root) for root in allowed):
        return real
    shown = ", ".join(str(root) for root in allowed) or "(none)"
    raise CwdNotAllowed(
        f"working directory {_quote(str(path))} (really {_quote(str(real))}) is outside the "
        f"directories this host lets sessions run in: {shown}",
        cwd=str(path)[:200],
        real=str(real)[:200],
        roots=[str(root) for root in allowed],
    )


def check_key(client_key: str | None) -> None:
    """Refuse an empty (it would be recorded as no key) or unencodable ``Idempotency-Key``
    (:class:`InvalidRequest`)."""
    if client_key is None:
        return
    if not client_key.strip():
        raise InvalidRequest("an Idempotency-Key must not be empty", field="Idempotency-Key")
    check_text("Idempotency-Key", client_key)


def check_lane(lane: str) -> str:
    """``lane`` when it is a lane name (:data:`LANE_PATTERN`), else :class:`InvalidRequest`."""
    if not isinstance(lane, str) or not _LANE.fullmatch(lane):
        raise InvalidRequest(
            f"{_quote(str(lane))} is not a lane name (a letter or digit, then up to 127 "
            "letters, digits, '.', '_' or '-')",
            lane=str(lane)[:200],
        )
    return lane


def check_same_send(prior: dict[str, Any], client_key: str, message: str, mode: str) -> None:
    """Refuse a send whose ``client_key`` accepted another message or mode before (``prior``:
    the ``run_started`` or ``queue_enqueued`` record that accepted it).

    Raises:
        IdempotencyKeyReused: naming the key and what differs.
    """
    if prior.get("type") == "run_started":
        had_mode, had = "prompt", prior.get("prompt")
    elif prior.get("type") == "queue_enqueued":
        had_mode, had = str(prior.get("queue")), prior.get("message")
    else:
        return  # a deferred write: no message to compare
    content = had.get("content") if isinstance(had, dict) else None
    if isinstance(content, list):
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    checks = (("mode", had_mode == mode), ("message", content == message))
    differ = [name for name, same in checks if not same]
    if differ:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {client_key[:200]!r} was used for another {' and '.join(differ)}"
            f" (accepted as {prior.get('runId') or prior.get('itemId')}); use a new key for a "
            "different request",
            key=client_key[:200],
            fields=differ,
        )
