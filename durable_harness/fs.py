"""File-system helpers shared by every layer (the file tools, the JSONL store): one place for each
rule (a path stays inside the working directory; a write a crash leaves whole). Blocking:
callers on an event loop run them in a worker thread. Imports only the standard library and
:mod:`durable_harness.errors`, so any layer may use it.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from durable_harness.errors import PathEscape

__all__ = [
    "append_durably",
    "atomic_write",
    "fsync_dir",
    "make_parents",
    "read_bytes_or_none",
    "resolve_path",
    "write_all",
]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def resolve_path(cwd: Path, path: str) -> Path:
    """Resolve ``path`` (relative to ``cwd`` or absolute, symlinks followed) and require it to
    stay inside ``cwd``.

    Raises:
        PathEscape: the resolved path is outside ``cwd`` (``details["path"]`` is ``path``).
    """
    root = Path(os.path.realpath(cwd))
    target = Path(os.path.realpath(root / path))
    if target != root and root not in target.parents:
        raise PathEscape(
            f"path {path!r} resolves to {target}, outside the working directory {root}", path=path
        )
    return target


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """``fsync`` ``directory`` so a name created, renamed or removed inside it is durable
    (POSIX: a directory entry is durable only once its directory is synced).

    Raises:
        NotADirectoryError: ``directory`` is not a directory.
        OSError: it cannot be opened or synced.
    """
    fd = os.open(os.fspath(directory), os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the open descriptor ``fd`` (``os.write`` may write less).

    Raises:
        OSError: a write failed (for example ``ENOSPC``); part of ``data`` may be written.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def make_parents(target: Path) -> None:
    """Create the missing parent directories of ``target`` and make their entries durable.

    Raises:
        OSError: a directory cannot be created (for example a parent is a regular file).
    """
    missing: list[Path] = []
    parent = target.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
        fsync_dir(directory.parent)


def atomic_write(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` (bytes) so a crash leaves either old or new content.

    A synced temporary file is renamed over it and the directory synced; missing parents are
    created; an existing target keeps its permission bits.

    Raises:
        IsADirectoryError: ``target`` is a directory.
        OSError: any step failed; the temporary file is removed and ``target`` is unchanged.
    """
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    make_parents(target)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)
    try:
        try:
            write_all(fd, data)
            try:
                os.fchmod(fd, os.stat(target).st_mode & 0o7777)
            except FileNotFoundError:
                pass
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)


def append_durably(target: Path, data: bytes) -> None:
    """Append ``data`` to ``target`` (``O_APPEND``) and ``fsync`` it; a new file (and any
    missing parent directory) also gets its directory entry synced.

    Raises:
        OSError: the file cannot be opened, written or synced.
    """
    make_parents(target)
    created = not target.exists()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _CLOEXEC, 0o666)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(target.parent)


def read_bytes_or_none(target: Path) -> bytes | None:
    """Return the bytes of the regular file ``target``, or ``None`` when it cannot be read."""
    try:
        return target.read_bytes()
    except OSError:
        return None
