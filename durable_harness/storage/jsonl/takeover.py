"""Takeover: when a lease is taken from a writer that may still be alive, the session moves
to a new inode so that writer's late writes can never land in the new writer's file."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from durable_harness.fs import fsync_dir
from durable_harness.storage.jsonl.framing import write_all
from durable_harness.storage.private import private_fd

if TYPE_CHECKING:
    from durable_harness.storage.jsonl.store import JsonlSessionStore


def detach_old_writer(store: JsonlSessionStore, content: bytes) -> None:
    """Move the session to a new inode holding ``content`` (the data, without padding).

    Called when the lease was taken from a writer that may still be alive (a broken lease,
    a removed or reset lock file). That writer checks the lease before each write, but a
    write can still slip in between its check and our takeover; its file descriptor now
    points at the old inode, so such a write, and a trim at its close, land there and can
    never overwrite or cut a line of ours. Costs one copy of the file, once per takeover.
    """
    tmp = f"{store.path}.takeover-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        private_fd(fd)
        write_all(fd, content)
        os.fsync(fd)
        os.rename(tmp, store.path)
    except BaseException:
        os.close(fd)
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(store.path) or ".")
    assert store._fd is not None
    os.close(store._fd)
    store._fd = fd
    store._size = len(content)
