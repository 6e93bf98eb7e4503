"""Opening a session file reads it whole once and finds where its padding starts without a copy
of the file (``design/storage.md``, "Opening a long session"): what it reads is the file, byte
for byte, and where the text ends is what ``rstrip`` would say."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_harness.storage import EntryOp, JsonlStore
from durable_harness.storage.jsonl import JsonlSessionStore
from durable_harness.storage.jsonl.scan import _text_end

BLANKS = b" \t\r\n"


@given(
    st.binary(max_size=64).map(lambda b: b.replace(b"\n", b"x")),
    st.integers(0, 600_000),
    st.binary(max_size=8).map(lambda b: bytes(BLANKS[x % 4] for x in b)),
)
def test_the_text_ends_where_rstrip_says(text: bytes, padding: int, tail: bytes) -> None:
    """Text, then a run of padding longer or shorter than any piece the search takes, then a
    few blanks of every kind."""
    data = text + b"\n" * padding + tail
    assert _text_end(data) == len(data.rstrip(BLANKS))


def test_a_file_is_read_whole_at_every_size(tmp_path: Path) -> None:
    """A session far larger than one read of the old loop (4 MiB) and a small one: the store's
    ``read_all`` gives the file's bytes, and the open indexes every entry."""
    store = JsonlStore(tmp_path)
    for count, size in ((3, 10), (700, 9_000)):
        with store.create_session(str(tmp_path), durability="none") as session:
            parent = None
            for i in range(count):
                entry = {
                    "type": "message",
                    "id": f"{count:04d}{i:012x}",
                    "parentId": parent,
                    "timestamp": "2026-12-08T00:00:00.000Z",
                    "message": {"role": "user", "content": f"{i} " + "y" * size},
                }
                session.commit([EntryOp(entry, lane="main")])
                parent = entry["id"]
            path = session.path
        reopened = JsonlSessionStore.open_path(path, write=False)
        try:
            assert reopened.file.read_all() == Path(path).read_bytes()
            assert reopened.entry_count() == count and not reopened.damage
            assert reopened.lane("main").leaf_id == parent
        finally:
            reopened.close()
    assert Path(path).stat().st_size > 6 << 20


def test_an_open_leaves_the_collector_as_it_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open reads the file with the cyclic collector off, and gives it back as it was: on
    when it was on (it collects afterwards), off when the application had turned it off, and
    on again when the read fails half-way."""
    import gc

    store = JsonlStore(tmp_path)
    with store.create_session(str(tmp_path), durability="none") as session:
        session.commit([EntryOp({"type": "custom", "id": "e1", "parentId": None}, lane="main")])
        path = session.location
    assert gc.isenabled()
    JsonlSessionStore.open_path(path, write=False).close()
    assert gc.isenabled()
    gc.disable()
    try:
        JsonlSessionStore.open_path(path, write=False).close()
        assert not gc.isenabled()
    finally:
        gc.enable()

    def fail(self: object, op: object, location: object) -> None:
        raise RuntimeError("the index failed")

    monkeypatch.setattr(JsonlSessionStore, "_apply", fail)
    with pytest.raises(RuntimeError, match="the index failed"):
        JsonlSessionStore.open_path(path, write=False)
    assert gc.isenabled()
