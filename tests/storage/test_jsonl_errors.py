"""The JSONL store's OS-error boundary, at the library (the CLI's own boundary is tested in
tests/cli/test_error_boundary.py): a failed write, fsync, read or delete leaves the store as a
typed error naming the session file and the cause, never as a bare ``OSError``."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import StorageError, StorageIOError
from durable_harness.storage import EntryOp, JsonlStore, RecordOp

from .util import ent, rec


def _failing(real: Callable[..., Any], code: int, when: Callable[[], bool]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if when():
            raise OSError(code, os.strerror(code))
        return real(*args)

    return call


def _session(tmp_path: Path, durability: str = "sync") -> Any:
    return JsonlStore(tmp_path / "store").create_session("/w", durability=durability)  # type: ignore[arg-type]


def test_a_failed_write_names_the_file_and_refuses_later_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _session(tmp_path)
    monkeypatch.setattr(os, "pwrite", _failing(os.pwrite, errno.ENOSPC, lambda: True))
    with pytest.raises(StorageIOError) as info:
        s.commit([RecordOp(rec("r1"))])
    assert info.value.message == f"{s.path}: No space left on device"
    assert info.value.details["errno"] == "ENOSPC"
    monkeypatch.undo()
    with pytest.raises(StorageError, match="a write failed"):  # file and index may disagree
        s.commit([RecordOp(rec("r2"))])
    s.close()


@pytest.mark.parametrize("durability", ["sync", "batch"])
def test_a_failed_fsync_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    s = _session(tmp_path, durability)
    monkeypatch.setattr(os, "fdatasync", _failing(os.fdatasync, errno.EIO, lambda: True))
    with pytest.raises(StorageIOError, match="Input/output error") as info:
        s.commit([EntryOp(ent("e1", None), lane="main")])
    assert info.value.details["path"] == s.path
    monkeypatch.undo()
    s.close()


def test_a_failed_read_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session(tmp_path)
    s.commit([EntryOp(ent("e1", None), lane="main")])
    monkeypatch.setattr(os, "pread", _failing(os.pread, errno.EIO, lambda: True))
    with pytest.raises(StorageIOError, match=f"{s.path}: Input/output error"):
        s.get_entry("e1")
    monkeypatch.undo()
    s.close()


def test_a_close_that_fails_still_releases_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JsonlStore(tmp_path / "store")
    s = store.create_session("/w")
    s.commit([EntryOp(ent("e1", None), lane="main")])
    monkeypatch.setattr(os, "ftruncate", _failing(os.ftruncate, errno.EIO, lambda: True))
    with pytest.raises(StorageIOError, match="Input/output error"):
        s.close()  # the padding cannot be cut: the file is valid with it
    monkeypatch.undo()
    again = store.open_session(s.session_id)  # not LeaseHeld: the lease went with the close
    assert again.get_entry("e1") is not None
    again.close()


def test_a_failed_delete_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = JsonlStore(tmp_path / "store")
    s = store.create_session("/w")
    s.close()
    monkeypatch.setattr(os, "unlink", _failing(os.unlink, errno.EACCES, lambda: True))
    with pytest.raises(StorageIOError, match="Permission denied"):
        store.delete_session(s.session_id)
    monkeypatch.undo()
    store.open_session(s.session_id).close()  # the lease went with the failed delete
