"""Files and credentials (issue 10): the store root and every folder a store creates are 0700,
every file 0600, under any umask; a looser session file is tightened when opened for writing."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_harness.storage import EntryOp, JsonlSessionStore, RecordOp, open_store
from durable_harness.storage.private import make_private_dirs

from .util import ent, rec


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    value: int = request.param
    old = os.umask(value)
    try:
        yield value
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _modes_under(top: Path) -> dict[str, int]:
    """Mode of ``top`` and of every folder and file below it."""
    out = {str(top): _mode(top)}
    for path in top.rglob("*"):
        out[str(path.relative_to(top))] = _mode(path)
    return out


def _check_private(top: Path) -> None:
    for name, mode in _modes_under(top).items():
        path = top / name if name != str(top) else top
        expected = 0o700 if path.is_dir() else 0o600
        assert mode == expected, f"{name}: {oct(mode)} (want {oct(expected)})"


UMASKS = [0o022, 0o000, 0o077, 0o777]


@pytest.mark.parametrize("umask", UMASKS, indirect=True, ids=oct)
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_store_folders_0700_files_0600_under_any_umask(
    tmp_path: Path, umask: int, backend: str
) -> None:
    """The store root, its missing parents and every folder below are 0700; session files,
    lock files, SQLite's database and its -wal/-shm files are 0600, with a torn tail
    quarantined too (a side file the store writes)."""
    top = tmp_path / "new" / "parents"
    spec = f"jsonl:{top}/root" if backend == "jsonl" else f"sqlite:{top}/db/s.db"
    store = open_store(spec)
    s = store.create_session("/some/project")
    s.commit([EntryOp(ent("e1"), lane="main"), RecordOp(rec("r1"))])
    if backend == "sqlite":
        s.commit([EntryOp(ent("e2", "e1"), lane="main")])
        _check_private(tmp_path / "new")  # -wal and -shm exist while the session is open
        assert (top / "db" / "s.db-wal").exists()
    s.close()
    if backend == "jsonl":
        path = Path(s.location)
        with open(path, "ab") as fh:  # a torn tail: quarantined on the next writable open
            fh.write(b'{"gen":1,"ops":[')
        store.open_session(s.session_id).close()
        assert list(path.parent.glob("*.torn-*"))
    _check_private(tmp_path / "new")


def test_existing_folders_keep_their_mode(tmp_path: Path) -> None:
    """A folder the store did not create (a user's, /tmp) is never changed."""
    tmp_path.chmod(0o755)
    make_private_dirs(tmp_path / "a" / "b")
    assert _mode(tmp_path) == 0o755
    assert _mode(tmp_path / "a") == 0o700 and _mode(tmp_path / "a" / "b") == 0o700


def test_looser_jsonl_session_file_is_tightened_when_opened_for_writing(tmp_path: Path) -> None:
    store = open_store(f"jsonl:{tmp_path}")
    s = store.create_session("/p")
    path = Path(s.location)
    s.close()
    path.chmod(0o644)
    store.open_session(s.session_id, write=False).close()
    assert _mode(path) == 0o644  # a read-only open changes nothing
    opened = JsonlSessionStore.open_path(str(path), write=True)
    assert _mode(path) == 0o600
    opened.close()
    path.chmod(0o640)
    store.open_session(s.session_id).close()
    assert _mode(path) == 0o600


def test_looser_sqlite_database_is_tightened_when_opened(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = open_store(f"sqlite:{db}")
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    s.close()
    for name in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if name.exists():
            name.chmod(0o666)
    open_store(f"sqlite:{db}").open_session(s.session_id).close()
    for name in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if name.exists():
            assert _mode(name) == 0o600, name
