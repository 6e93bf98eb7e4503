"""Session lookup by working directory (``Store.list_sessions(cwd)``, ``Store.most_recent``),
on every backend, with real directories and symlinks under ``tmp_path``.

The rule (``storage/base.py`` ``CwdMatcher``, ``design/storage.md``): a session belongs to a
directory when the cwd recorded in its header names the same directory as real paths; the
literal spelling counts where the recorded directory no longer exists; the JSONL folder name
(pi's encoding, which maps ``x/y`` and ``x-y`` to one folder) is never consulted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.errors import CorruptSession, SessionUnreadable
from durable_harness.storage import EntryOp, JsonlStore, Store, open_store
from durable_harness.storage.base import CwdMatcher
from durable_harness.storage.jsonl import cwd_dir_name

from .util import ent


def _new(store: Store, cwd: Path | str) -> str:
    """Create a session of ``cwd`` holding one entry; return its id."""
    with store.create_session(str(cwd)) as s:
        s.commit([EntryOp(ent("e1"))])
        return s.session_id


def _ids(store: Store, cwd: Path | str) -> list[str]:
    return [i.id for i in store.list_sessions(str(cwd))]


def test_x_slash_y_and_x_dash_y_are_different_directories(store: Store, tmp_path: Path) -> None:
    xy, x_y = tmp_path / "x" / "y", tmp_path / "x-y"
    xy.mkdir(parents=True)
    x_y.mkdir()
    assert cwd_dir_name(str(xy)) == cwd_dir_name(str(x_y))  # pi's encoding collides
    first = _new(store, xy)

    assert _ids(store, x_y) == []
    assert store.most_recent(str(x_y)) is None, "x-y must not find the session of x/y"

    second = _new(store, x_y)
    assert _ids(store, xy) == [first]
    assert _ids(store, x_y) == [second]
    assert store.most_recent(str(xy)).id == first  # type: ignore[union-attr]
    assert store.most_recent(str(x_y)).id == second  # type: ignore[union-attr]
    if isinstance(store, JsonlStore):  # both still browse under pi's one folder
        paths = {Path(i.path).parent for i in store.list_sessions()}
        assert paths == {store.sessions_dir / cwd_dir_name(str(xy))}


@pytest.mark.parametrize("started_via", ["link", "real"])
def test_a_project_reached_through_a_symlink_is_one_directory(
    store: Store, tmp_path: Path, started_via: str
) -> None:
    real = tmp_path / "disk" / "proj"
    real.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    sid = _new(store, link if started_via == "link" else real)
    for spelling in (real, link, tmp_path / "disk" / ".." / "link", f"{real}/"):
        assert _ids(store, spelling) == [sid], spelling
        assert store.most_recent(str(spelling)).id == sid  # type: ignore[union-attr]
    assert _ids(store, tmp_path / "disk") == []


def test_a_project_moved_behind_a_symlink_is_still_found(store: Store, tmp_path: Path) -> None:
    old = tmp_path / "old" / "proj"
    old.mkdir(parents=True)
    sid = _new(store, old)
    new = tmp_path / "new" / "proj"
    new.parent.mkdir()
    old.rename(new)
    old.symlink_to(new, target_is_directory=True)
    assert _ids(store, new) == [sid]
    assert _ids(store, old) == [sid]
    assert store.most_recent(str(new)).id == sid  # type: ignore[union-attr]


def test_a_moved_project_without_a_symlink_is_not_claimed(store: Store, tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    sid = _new(store, old)
    new = tmp_path / "new"
    old.rename(new)
    assert _ids(store, new) == []
    # the recorded directory is gone: its literal spelling still finds the session
    assert _ids(store, old) == [sid]
    assert _ids(store, f"{old}//") == [sid]


def test_a_directory_with_no_session_of_its_own_has_none(store: Store, tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    (parent / "child").mkdir(parents=True)
    (tmp_path / "sibling").mkdir()
    _new(store, parent)
    _new(store, tmp_path / "sibling")
    assert store.most_recent(str(parent / "child")) is None
    assert _ids(store, parent / "child") == []


def test_matcher_edge_spellings(tmp_path: Path) -> None:
    match = CwdMatcher(str(tmp_path))
    assert not match("")  # a header that lost its cwd matches nothing
    assert not match("proj")
    assert CwdMatcher("proj")("proj")  # relative: literal only
    assert match(f"{tmp_path}/./")
    assert not match(str(tmp_path / "x"))


# -- files that cannot be read --------------------------------------------------------------


def test_a_jsonl_entry_that_cannot_be_read_is_listed_with_its_error(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "home")
    proj = tmp_path / "proj"
    proj.mkdir()
    sid = _new(store, proj)
    folder = store.sessions_dir / cwd_dir_name(str(proj))
    # a directory where a session file should be: open() fails with EISDIR, even for root
    bad = folder / "2026-01-01T00-00-00-000Z_0badbad0.jsonl"
    bad.mkdir()
    os.utime(bad, (4102444800, 4102444800))  # newer than every other session

    listed = {i.id: i for i in store.list_sessions()}
    assert set(listed) == {sid, "0badbad0"}
    error = listed["0badbad0"].error
    assert error is not None and error["code"] == "session_unreadable"
    assert error["errno"] == "EISDIR" and str(bad) in error["message"]
    assert listed["0badbad0"].path == str(bad) and listed["0badbad0"].cwd == ""
    assert listed[sid].error is None

    # a cwd listing shows it where its folder points (its recorded cwd is unknown)
    assert [i.id for i in store.list_sessions(str(proj))] == ["0badbad0", sid]
    assert store.list_sessions(str(tmp_path)) == []
    with pytest.raises(SessionUnreadable) as info:
        store.most_recent(str(proj))
    assert info.value.details == {"path": str(bad), "errno": "EISDIR"}
    with pytest.raises(SessionUnreadable):
        store.open_session("0badbad0", write=False)
    store.open_session(sid, write=False).close()  # the readable one still opens


def test_a_session_file_that_fails_with_eio_is_listed_with_eio(tmp_path: Path) -> None:
    """A read that fails with a real EIO: the "file" is a symlink to ``/proc/self/mem``, whose
    offset 0 is never mapped, so reading it fails with EIO in whichever process reads it."""
    mem = Path("/proc/self/mem")
    if not mem.exists():
        pytest.skip("no /proc/self/mem on this system: no source of a real EIO")
    store = JsonlStore(tmp_path / "home")
    proj = tmp_path / "proj"
    proj.mkdir()
    sid = _new(store, proj)
    eio = store.sessions_dir / cwd_dir_name(str(proj)) / "2026-01-01T00-00-00-000Z_e10e10.jsonl"
    eio.symlink_to(mem)
    by_id = {i.id: i for i in store.list_sessions(str(proj))}
    assert set(by_id) == {sid, "e10e10"}
    assert by_id["e10e10"].error is not None
    assert by_id["e10e10"].error["errno"] == "EIO"
    assert by_id["e10e10"].path == str(eio)
    with pytest.raises(SessionUnreadable) as info:
        store.open_session("e10e10", write=False)
    assert info.value.details["errno"] == "EIO"


def test_a_dangling_session_symlink_is_listed_with_enoent(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "home")
    proj = tmp_path / "proj"
    proj.mkdir()
    sid = _new(store, proj)
    folder = store.sessions_dir / cwd_dir_name(str(proj))
    dangling = folder / "2026-01-01T00-00-00-000Z_dangl1ng.jsonl"
    dangling.symlink_to(tmp_path / "moved-away.jsonl")
    rows = {i.id: i for i in store.list_sessions(str(proj))}
    assert set(rows) == {sid, "dangl1ng"}
    assert rows["dangl1ng"].error is not None and rows["dangl1ng"].error["errno"] == "ENOENT"


def test_a_damaged_header_without_cwd_is_not_continued(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path / "home")
    proj = tmp_path / "proj"
    proj.mkdir()
    sid = _new(store, proj)
    (info,) = store.list_sessions()
    path = Path(info.path)
    lines = path.read_bytes().split(b"\n", 1)
    path.write_bytes(b"{garbage\n" + lines[1])
    (again,) = store.list_sessions(str(proj))
    assert again.id == sid and again.cwd == ""
    with pytest.raises(CorruptSession):
        store.most_recent(str(proj))


_LIST = """
import json, sys
from durable_harness.errors import DurableHarnessError
from durable_harness.storage import open_store
try:
    infos = open_store(sys.argv[1]).list_sessions(sys.argv[2] or None)
    print(json.dumps([vars(i) for i in infos]))
except DurableHarnessError as exc:
    print(json.dumps({"error": exc.to_json()}))
"""


def _list_unprivileged(prefix: list[str], spec: str, cwd: str = "") -> object:
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", _LIST, spec, cwd],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


def test_a_mode_000_session_file_is_listed_with_eacces(
    tmp_path: Path, unprivileged: list[str]
) -> None:
    store = JsonlStore(tmp_path / "home")
    proj = tmp_path / "proj"
    proj.mkdir()
    good = _new(store, proj)
    bad = _new(store, proj)
    bad_path = next(Path(i.path) for i in store.list_sessions() if i.id == bad)
    bad_path.chmod(0)
    for cwd in ("", str(proj)):
        rows = _list_unprivileged(unprivileged, store.spec, cwd)
        assert isinstance(rows, list)
        by_id = {r["id"]: r for r in rows}
        assert set(by_id) == {good, bad}, cwd
        assert by_id[good]["error"] is None
        assert by_id[bad]["path"] == str(bad_path)
        assert by_id[bad]["error"]["code"] == "session_unreadable"
        assert by_id[bad]["error"]["errno"] == "EACCES"


def test_a_folder_that_cannot_be_listed_is_listed_with_its_error(
    tmp_path: Path, unprivileged: list[str]
) -> None:
    store = JsonlStore(tmp_path / "home")
    proj = tmp_path / "proj"
    proj.mkdir()
    _new(store, proj)
    folder = store.sessions_dir / cwd_dir_name(str(proj))
    folder.chmod(0)
    try:
        rows = _list_unprivileged(unprivileged, store.spec, str(proj))
    finally:
        folder.chmod(0o700)
    assert isinstance(rows, list) and len(rows) == 1
    assert rows[0]["path"] == str(folder) and rows[0]["id"] == ""
    assert rows[0]["error"]["errno"] == "EACCES"


def test_an_unreadable_sqlite_store_is_a_typed_error(
    tmp_path: Path, unprivileged: list[str]
) -> None:
    store = open_store(f"sqlite:{tmp_path / 's.db'}")
    _new(store, tmp_path)
    (tmp_path / "s.db").chmod(0)
    got = _list_unprivileged(unprivileged, store.spec)
    assert got == {
        "error": {
            "code": "session_unreadable",
            "message": got["error"]["message"],  # type: ignore[index]
            "path": str(tmp_path / "s.db"),
            "errno": "EACCES",
        }
    }
    assert str(tmp_path / "s.db") in got["error"]["message"]  # type: ignore[index]
