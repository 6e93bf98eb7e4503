"""Finding a session by exact id without listing the store (``Store.find_exact``), on every
backend, and the JSONL id links falling back to the listing whenever they are missing or wrong
(``design/storage.md``, "Finding a session by id")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import AmbiguousSessionPrefix, SessionNotFound, SessionUnreadable
from durable_harness.storage import Store, open_store
from durable_harness.storage.jsonl import JsonlStore

KINDS = ["memory", "jsonl", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    kind = request.param
    if kind == "memory":
        return open_store("memory:")
    if kind == "postgres":
        return open_store(request.getfixturevalue("pg_spec"))
    if kind == "jsonl":
        return open_store(f"jsonl:{tmp_path / 'home'}")
    return open_store(f"sqlite:{tmp_path / 's.db'}")


def _no_listing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("an exact id was looked up by listing the whole store")

    monkeypatch.setattr(store, "list_sessions", refuse)


def test_an_exact_id_is_found_without_listing_the_store(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = []
    for i in range(5):
        s = any_store.create_session(f"/p{i}")
        ids.append(s.session_id)
        s.close()
    listed = {i.id: i for i in any_store.list_sessions()}
    _no_listing(any_store, monkeypatch)
    for sid in ids:
        info = any_store.resolve(sid)
        assert info == listed[sid]  # the very row the listing gives
        assert any_store.find_exact(sid) == listed[sid]
        with any_store.open_session(sid, write=False) as opened:
            assert opened.session_id == sid


def test_prefixes_keep_their_rules(any_store: Store) -> None:
    for sid in ("cccc", "cccc-longer", "abcd0001", "abcd0002"):
        any_store.create_session("/p", session_id=sid).close()
    assert any_store.find_exact("abcd") is None
    assert any_store.resolve("cccc").id == "cccc"  # an exact id wins over a longer one
    assert any_store.resolve("cccc-l").id == "cccc-longer"
    with pytest.raises(AmbiguousSessionPrefix) as caught:
        any_store.resolve("abcd000")
    assert caught.value.details["candidates"] == ["abcd0001", "abcd0002"]
    for missing in ("zzzz", "abcd0003", "cccc-longer-still", "%", "_"):
        with pytest.raises(SessionNotFound):
            any_store.resolve(missing)
    assert any_store.find_exact("zzzz") is None


def test_database_prefixes_are_read_by_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"sqlite:{tmp_path / 's.db'}")
    for sid in ("ab_1", "abx1", "ab%2"):
        store.create_session("/p", session_id=sid).close()
    _no_listing(store, monkeypatch)
    assert store.resolve("ab_").id == "ab_1"  # '_' and '%' are not wildcards
    assert store.resolve("ab%").id == "ab%2"
    assert store.resolve("abx").id == "abx1"


def _jsonl(tmp_path: Path) -> tuple[JsonlStore, str]:
    store = open_store(f"jsonl:{tmp_path / 'home'}")
    assert isinstance(store, JsonlStore)
    s = store.create_session("/p")
    sid = s.session_id
    s.close()
    return store, sid


def test_jsonl_link_missing_falls_back_to_the_listing(tmp_path: Path) -> None:
    store, sid = _jsonl(tmp_path)
    path = store.resolve(sid).path
    os.unlink(store.ids_dir / sid)  # a crash between the session file and its link
    assert store.find_exact(sid) is None
    assert store.resolve(sid).path == path
    assert store.resolve(sid[:12]).id == sid


def test_jsonl_link_to_another_session_is_not_trusted(tmp_path: Path) -> None:
    store, sid = _jsonl(tmp_path)
    other = store.create_session("/q")
    other_id = other.session_id
    other.close()
    os.unlink(store.ids_dir / sid)
    os.symlink(os.readlink(store.ids_dir / other_id), store.ids_dir / sid)
    assert store.find_exact(sid) is None  # the header names another id
    assert store.resolve(sid).id == sid  # found by the listing
    for bad in ("/etc/passwd", "../../outside.jsonl", "../sessions/../x.jsonl"):
        os.unlink(store.ids_dir / sid)
        os.symlink(bad, store.ids_dir / sid)
        assert store.find_exact(sid) is None
        assert store.resolve(sid).id == sid


def test_jsonl_delete_removes_the_link_and_the_id_is_gone(tmp_path: Path) -> None:
    store, sid = _jsonl(tmp_path)
    store.delete_session(sid)
    assert not os.path.lexists(store.ids_dir / sid)
    with pytest.raises(SessionNotFound):
        store.resolve(sid)


_RESOLVE = """
import json, sys
from durable_harness.errors import DurableHarnessError
from durable_harness.storage import open_store
store = open_store(sys.argv[1])
row = store.find_exact(sys.argv[2])
try:
    store.resolve(sys.argv[2])
    error = None
except DurableHarnessError as exc:
    error = exc.to_json()
print(json.dumps({"row": row is not None, "error": error}))
"""


def test_jsonl_unreadable_file_through_its_link_is_named(
    tmp_path: Path, unprivileged: list[str]
) -> None:
    store, sid = _jsonl(tmp_path)
    path = store.resolve(sid).path
    os.chmod(path, 0)
    try:  # read without root's override of file permissions (the ``unprivileged`` prefix)
        proc = subprocess.run(
            [*unprivileged, sys.executable, "-c", _RESOLVE, store.spec, sid],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        os.chmod(path, 0o600)
    seen = json.loads(proc.stdout)
    assert seen["row"] is True  # the row, with its error
    assert seen["error"]["code"] == SessionUnreadable.code
