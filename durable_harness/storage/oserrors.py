"""The one boundary where operating-system and database errors become typed errors:
:func:`translate`, applied by :func:`boundary` on store methods that do I/O and by
:func:`storage_boundary` around a block (``design/cli.md`` "Errors: one boundary each side")."""

from __future__ import annotations

import errno
import functools
import inspect
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from durable_harness.errors import (
    CorruptSession,
    DatabaseLocked,
    DurableHarnessError,
    StorageError,
    StorageIOError,
)

BUSY_TIMEOUT_ENV = "DURABLE_HARNESS_SQLITE_BUSY_TIMEOUT"
DEFAULT_BUSY_TIMEOUT_S = 10.0
"""Seconds a SQLite connection waits for another's lock before DatabaseLocked
(``$DURABLE_HARNESS_SQLITE_BUSY_TIMEOUT`` overrides it).
"""

# SQLite primary result codes (https://www.sqlite.org/rescode.html) that are OS conditions,
# with the errno name and wording a user knows them by.
_SQLITE_AS_OS: dict[str, tuple[str, str]] = {
    "SQLITE_FULL": ("ENOSPC", "No space left on device (database or disk is full)"),
    "SQLITE_IOERR": ("EIO", "Input/output error (disk I/O error)"),
    "SQLITE_READONLY": ("EROFS", "Read-only: the database file or its folder cannot be written"),
    "SQLITE_CANTOPEN": ("EACCES", "Cannot open the database file (missing or not permitted)"),
    "SQLITE_PERM": ("EACCES", "Permission denied"),
    "SQLITE_AUTH": ("EACCES", "Permission denied"),
}

F = TypeVar("F", bound=Callable[..., Any])

Translator = Callable[[BaseException, "str | None"], BaseException]
_FAMILIES: list[tuple[type[BaseException], Translator]] = []
CAUGHT: tuple[type[BaseException], ...] = (OSError, sqlite3.Error)
"""The exception types the boundary catches: OS, SQLite, and every registered family."""


def register_family(kind: type[BaseException], translator: Translator) -> None:
    """Make the boundary catch ``kind`` (a driver's base error, e.g. ``psycopg.Error``) and turn it
    into ``translator(exc, where)``; the backend registers it on import (replacing any earlier)."""
    global CAUGHT
    _FAMILIES[:] = [(k, t) for k, t in _FAMILIES if k is not kind]
    _FAMILIES.append((kind, translator))
    CAUGHT = (OSError, sqlite3.Error, *(k for k, _t in _FAMILIES))


def busy_timeout_s() -> float:
    """The SQLite busy timeout in seconds (see :data:`DEFAULT_BUSY_TIMEOUT_S`).

    Raises:
        StorageError: the environment variable is not a non-negative number.
    """
    raw = os.environ.get(BUSY_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_BUSY_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise StorageError(
            f"{BUSY_TIMEOUT_ENV}={raw!r} is not a number of seconds", env=BUSY_TIMEOUT_ENV
        )
    return value


def translate(exc: BaseException, where: str | None = None) -> BaseException:
    """Return the typed error for ``exc`` (``where``: the store or file it was about, used when
    ``exc`` names no file), or ``exc`` itself when it is not an OS or database error."""
    if isinstance(exc, DurableHarnessError):
        return exc
    for kind, translator in _FAMILIES:
        if isinstance(exc, kind):
            return translator(exc, where)
    if isinstance(exc, OSError):
        path = _path_of(exc) or where
        name = errno.errorcode.get(exc.errno or -1, "") if exc.errno else ""
        cause = exc.strerror or str(exc) or type(exc).__name__
        return StorageIOError(
            f"{path}: {cause}" if path else cause, path=path, errno=name or None, cause=cause
        )
    if isinstance(exc, sqlite3.Error):
        path = where or "SQLite database"
        code = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        primary = "_".join(code.split("_")[:2])
        if primary in ("SQLITE_BUSY", "SQLITE_LOCKED") or "database is locked" in text:
            try:
                timeout = busy_timeout_s()
            except StorageError:
                timeout = DEFAULT_BUSY_TIMEOUT_S
            return DatabaseLocked(
                f"{path}: database is locked by another connection (waited {timeout:g} s); "
                "retry once the other process has finished",
                path=path,
                timeout_s=timeout,
                sqlite_error=code or None,
            )
        if primary in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
            return CorruptSession(f"{path}: {text}", path=path, sqlite_error=code or None)
        if code == "SQLITE_READONLY_DIRECTORY":
            folder = os.path.dirname(path) or "."
            cause = (
                f"Read-only: the folder {folder} cannot be written, and SQLite must create its "
                "-wal and -shm files beside the database even to read it"
            )
            return StorageIOError(
                f"{path}: {cause}", path=path, errno="EROFS", cause=cause, sqlite_error=code
            )
        if primary == "SQLITE_CANTOPEN" and where:
            reason = _open_error(where)
            if reason is not None:  # SQLite does not say why; the OS does
                return translate(reason, where)
        if primary in _SQLITE_AS_OS:
            name, cause = _SQLITE_AS_OS[primary]
            return StorageIOError(
                f"{path}: {cause}", path=path, errno=name, cause=cause, sqlite_error=code
            )
        return StorageIOError(
            f"{path}: database error: {text}", path=path, errno=code or None, cause=text
        )
    return exc


def _open_error(path: str) -> OSError | None:
    """Why the OS refuses to open ``path`` for reading (or its folder), or ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return exc
    os.close(fd)
    return None


def _path_of(exc: OSError) -> str | None:
    if exc.filename is None:
        return None
    name = os.fsdecode(exc.filename)
    if exc.filename2 is not None:
        name += f" -> {os.fsdecode(exc.filename2)}"
    return name


@contextmanager
def storage_boundary(where: str | None = None) -> Iterator[None]:
    """Translate OS and database errors raised in the block (see :func:`translate`).

    Raises:
        StorageIOError, DatabaseLocked, CorruptSession: from an ``OSError`` or ``sqlite3.Error``.
    """
    try:
        yield
    except CAUGHT as exc:
        raise translate(exc, where) from exc


def _where(obj: Any, args: tuple[Any, ...]) -> str | None:
    """The location a store method is about: the store's own, else a path argument."""
    if not isinstance(obj, type):  # a class method's ``cls`` has no location yet
        for attr in ("db_path", "location", "path", "spec"):
            value = getattr(obj, attr, None)
            if isinstance(value, str) and value:
                return value
    for arg in args:
        if isinstance(arg, str | os.PathLike):
            return os.fsdecode(arg)
    return None


def boundary(fn: F) -> F:
    """Decorate a store method (sync or async) that does I/O, so OS and database errors leave it
    typed, naming the store's location (else a path argument)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(self, *args, **kwargs)
            except CAUGHT as exc:
                raise translate(exc, _where(self, args)) from exc

        wrapper: Any = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except CAUGHT as exc:
                raise translate(exc, _where(self, args)) from exc

        wrapper = sync_wrapper
    return wrapper  # type: ignore[no-any-return]
