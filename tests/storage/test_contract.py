"""The storage contract of ``storage/base.py``: the public conformance suite
(:func:`durable_harness.testing.check_session_store`) on every backend of the project, one test
per check, plus what only a file-backed backend promises (modes, read costs). The suite is also
shown to fail on a backend that breaks the contract."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import FormatError, InvalidOp
from durable_harness.storage import EntryOp, LaneOp, SessionStore, Store, open_store
from durable_harness.testing import check_session_store
from durable_harness.testing.conformance import CHECKS, ConformanceError

from .util import ent


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


#: What the ``memory:`` store (a one-process scratch store: design/storage.md) does not promise.
MEMORY_EXEMPT = {
    "durability_modes": "nothing is durable: the mode is always none",
}


def _memory_store() -> Store:
    try:
        return open_store("memory:")
    except FormatError:
        pytest.skip("this build has no open_store('memory:') (it comes with the top-level API)")


def _factory(kind: str, tmp: Path, request: pytest.FixtureRequest | None = None) -> Any:
    count = 0

    def make() -> Store:
        nonlocal count
        count += 1
        if kind == "memory":
            return _memory_store()
        if kind == "postgres":
            assert request is not None
            return open_store(request.getfixturevalue("pg_spec_factory")())
        if kind == "jsonl":
            return open_store(f"jsonl:{tmp / str(count)}")
        return open_store(f"sqlite:{tmp / f'{count}.db'}")

    return make


def _cases() -> list[Any]:
    """Every backend x every check, but the checks the memory store does not promise."""
    kinds = ["memory", "jsonl", "sqlite", "postgres"]
    return [
        pytest.param(kind, check, marks=[pytest.mark.postgres] if kind == "postgres" else [])
        for kind in kinds
        for check in CHECKS
        if not (kind == "memory" and check in MEMORY_EXEMPT)
    ]


@pytest.mark.parametrize(("kind", "check"), _cases())
def test_backend_keeps_the_contract(
    kind: str, check: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reopen = None if kind == "memory" else (lambda s: open_store(s.spec))
    factory = _factory(kind, tmp_path, request)
    assert check_session_store(factory, reopen_store=reopen, only=[check]) == [check]


class _OffByOneStore:
    """A JSONL store whose sessions report every commit's seq one lower than stored: a
    backend that breaks the contract."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.spec = inner.spec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_session(self, *args: Any, **kwargs: Any) -> SessionStore:
        s = self._inner.create_session(*args, **kwargs)
        real = s.commit
        s.commit = lambda ops, **kw: real(ops, **kw) - 1  # type: ignore[method-assign]
        return s


def test_the_suite_catches_a_broken_backend(tmp_path: Path) -> None:
    make = _factory("jsonl", tmp_path)
    with pytest.raises(ConformanceError, match=r"^seq: seqs returned by commit: got \[0, 1"):
        check_session_store(lambda: _OffByOneStore(make()), only=["seq"])  # type: ignore[arg-type, return-value]
    with pytest.raises(KeyError):
        check_session_store(make, only=["no_such_check"])


def test_file_permissions(store: Store, tmp_path: Path) -> None:
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1"), lane="main")])
    try:
        if store.spec.startswith("jsonl:"):
            path = s.location
            assert _mode(path) == 0o600
            assert _mode(os.path.dirname(path)) == 0o700
            assert _mode(path + ".lock") == 0o600
        else:
            db = tmp_path / "s.db"
            assert _mode(db) == 0o600
            for side in ("s.db-wal", "s.db-shm"):
                if (tmp_path / side).exists():
                    assert _mode(tmp_path / side) == 0o600, side
            locks = tmp_path / "s.db.locks"
            assert _mode(locks) == 0o700
            assert {_mode(p) for p in locks.iterdir()} == {0o600}
    finally:
        s.close()


def test_jsonl_decodes_each_commit_line_once_per_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit of many entries (as an import writes) must not be re-read for every entry."""
    s = open_store(f"jsonl:{tmp_path}").create_session("/p")
    ops = [EntryOp(ent(f"e{i}", f"e{i - 1}" if i else None, pad="x" * 200)) for i in range(300)]
    s.commit([*ops, LaneOp("main", leaf_id="e299")])
    s.commit([EntryOp(ent("tail", "e299"), lane="main")])
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(offset)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    try:
        assert len(s.iter_entries()) == 301
        assert len(reads) <= 2
        reads.clear()
        leaf = "tail"
        walked = 0
        while leaf is not None:  # a leaf-to-root walk, as building a context does
            entry = s.get_entry(leaf)
            assert entry is not None
            leaf = entry["parentId"]
            walked += 1
        assert walked == 301
        assert len(reads) <= 2
    finally:
        monkeypatch.undo()
        s.close()


def test_the_memory_store_refuses_what_a_file_could_not_hold() -> None:
    """The memory store keeps entries as the JSON a file backend would write: a value JSON
    cannot represent is refused at commit, as on JSONL and SQLite, and nothing is kept."""
    s = open_store("memory:").create_session("/p")
    with pytest.raises(InvalidOp, match="JSON cannot represent"):
        s.commit([EntryOp(ent("e1", body={1j}), lane="main")])
    assert (s.entry_count(), s.last_seq(), s.lane("main").leaf_id) == (0, 0, None)
    s.commit([EntryOp(ent("e1"), lane="main")])
    assert s.last_seq() == 1
