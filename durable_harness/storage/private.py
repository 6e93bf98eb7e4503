"""Private files and folders: what a store creates is readable by its owner only.

Session files hold prompts, tool output and model answers, which may include secrets. Every
folder a store creates is ``0700`` and every file ``0600``, whatever the process umask: the
mode is passed at creation *and* set with ``chmod`` afterwards, because the umask can only
remove bits (a umask of ``0o077`` is harmless, but ``0o777`` would leave ``0o000`` and a file
the store itself cannot reopen). Folders that already exist (a user's project folder, ``/tmp``)
are never changed. An existing session file with group or other bits is tightened to ``0600``
when it is opened for writing (``design/storage.md``, "Files and modes").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
"""Mode of every folder a store creates."""
FILE_MODE = 0o600
"""Mode of every file a store creates, and of a session file opened for writing."""


def make_private_dirs(path: str | Path) -> None:
    """Create ``path`` and any missing parents, each created one ``0700``.

    Existing folders keep their mode. Raises ``OSError`` as ``os.mkdir`` does (``FileExistsError``
    only when a component exists and is not a folder).
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
    """Set an open file's mode to ``0600`` unless it is already (one ``fstat``, and one
    ``fchmod`` when needed). A file owned by another user is left as it is (``EPERM``)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode != FILE_MODE:
        try:
            os.fchmod(fd, FILE_MODE)
        except PermissionError:
            pass


def tighten_fd(fd: int) -> None:
    """Remove group and other permission bits from an open file that has any (a session file
    opened for writing); owner bits are left as they are."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & 0o077:
        try:
            os.fchmod(fd, mode & ~0o077 & 0o7777)
        except PermissionError:
            pass


def tighten_path(path: str | Path) -> None:
    """:func:`tighten_fd` by path, for a file another library opens (an SQLite database and its
    ``-wal``/``-shm`` files); a missing file is skipped."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    if mode & 0o077:
        try:
            os.chmod(path, mode & ~0o077 & 0o7777)
        except PermissionError:
            pass
