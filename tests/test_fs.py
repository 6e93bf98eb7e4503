"""The shared file-system helpers (:mod:`durable_harness.fs`) on their own; the file
tools' tests exercise them through the tools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_harness.errors import PathEscape
from durable_harness.fs import (
    append_durably,
    atomic_write,
    fsync_dir,
    read_bytes_or_none,
    resolve_path,
)


def test_fsync_dir_takes_str_and_path_and_refuses_a_file(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    fsync_dir(str(tmp_path))
    plain = tmp_path / "f"
    plain.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        fsync_dir(plain)


def test_atomic_write_keeps_mode_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "f.txt"
    atomic_write(target, b"one")
    os.chmod(target, 0o640)
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.txt"]


def test_atomic_write_over_a_directory_fails_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / "d", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_append_durably_creates_then_appends(tmp_path: Path) -> None:
    target = tmp_path / "new" / "log.txt"
    append_durably(target, b"a\n")
    append_durably(target, b"b\n")
    assert read_bytes_or_none(target) == b"a\nb\n"
    assert read_bytes_or_none(tmp_path / "missing") is None


def test_resolve_path_refuses_a_symlink_out(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "out").symlink_to(tmp_path)
    assert resolve_path(work, "x/../y") == work.resolve() / "y"
    with pytest.raises(PathEscape) as info:
        resolve_path(work, "out/secret")
    assert info.value.details["path"] == "out/secret"
