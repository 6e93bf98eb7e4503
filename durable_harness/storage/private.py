"""Private files and folders: what a store creates is ``0700`` / ``0600`` whatever the umask,
existing folders untouched (``design/storage.md`` "Files and modes")."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

DIR_MODE = 0o700
"""Mode of every folder a store creates."""
FILE_MODE = 0o600
"""Mode of every file a store creates, and of a session file opened for writing."""


def make_private_dirs(path: str | Path) -> None:
    """Create ``path`` and any missing parents, each ``0700`` (existing folders keep their mode).

    Raises:
        OSError: as ``os.mkdir`` (``FileExistsError`` only for a component that is no folder).
    """
    target = Path(path)
    missing: list[Path] = []
    current = target
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made by a concurrent caller: not ours to change
        os.chmod(folder, DIR_MODE)


def private_fd(fd: int) -> None:
    """Set an open file's mode to ``0600`` unless it is already (another user's file is left)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode != FILE_MODE:
        try:
            os.fchmod(fd, FILE_MODE)
        except PermissionError:
            pass


def tighten_fd(fd: int) -> None:
    """Remove group and other permission bits from an open file (owner bits kept)."""
    _tighten(stat.S_IMODE(os.fstat(fd).st_mode), lambda mode: os.fchmod(fd, mode))


def tighten_path(path: str | Path) -> None:
    """:func:`tighten_fd` by path, for a file another library opens; a missing file is skipped."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    _tighten(mode, lambda new: os.chmod(path, new))


def _tighten(mode: int, chmod: Callable[[int], None]) -> None:
    if mode & 0o077:
        try:
            chmod(mode & ~0o077 & 0o7777)
        except PermissionError:
            pass
