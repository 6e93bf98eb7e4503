"""Lone UTF-16 surrogate escapes in stored lines (issue 10, "Text and results read back").

Other agents write ``"\\ud83d"`` with no low half when they cut text by UTF-16 units. Such a
line loads with U+FFFD in place of the lone half and a ``replaced_surrogate`` warning that names
the entry; the bytes on disk are never changed. Both our JSONL files and pi files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from durable_harness.session import open_session
from durable_harness.session.pi import open_pi_file
from durable_harness.storage import EntryOp, JsonlSessionStore, RecordOp, codec, open_store
from durable_harness.storage.damage import WARNING_KINDS

from .util import ent, rec

HIGH, LOW = rb"\ud83d", rb"\udc00"


def _replace(path: Path, marks: dict[bytes, bytes]) -> bytes:
    data = path.read_bytes()
    for mark, escape in marks.items():
        assert mark in data
        data = data.replace(mark, escape)
    path.write_bytes(data)
    return data


def _warnings(damage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in damage if d["kind"] == "replaced_surrogate"]


# -- the codec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value", "count"),
    [
        (rb'{"a":"x\ud83d"}', {"a": "x\ufffd"}, 1),  # lone high at the end
        (rb'{"a":"\udc00y"}', {"a": "\ufffdy"}, 1),  # lone low
        (rb'{"a":"\ud83d\ude00"}', {"a": "\U0001f600"}, 0),  # a valid pair is kept
        (rb'{"a":"\uD83D\uD83D\uDE00"}', {"a": "\ufffd\U0001f600"}, 1),  # high, then a pair
        (rb'{"a":"\ud800\ud800"}', {"a": "\ufffd\ufffd"}, 2),
        (rb'{"\ud800":1}', {"\ufffd": 1}, 1),  # in a key
        (rb'{"a":"\\ud83d"}', {"a": "\\ud83d"}, 0),  # an escaped backslash, not an escape
        (rb'{"a":"\\\ud83d"}', {"a": "\\\ufffd"}, 1),  # backslash, then a lone half
    ],
)
def test_codec_loads_lone_surrogate_as_replacement_char(raw: bytes, value: Any, count: int) -> None:
    assert codec.loads_counted(raw) == (value, count)
    assert codec.loads(raw) == value


def test_codec_still_rejects_bad_json_around_a_lone_surrogate() -> None:
    with pytest.raises(ValueError):
        codec.loads(rb'{"a":"\ud83d",}')
    with pytest.raises(ValueError):
        codec.loads(rb'{"a":"\ud83d", "b": NaN}')  # orjson's rules still hold after the repair


def test_codec_paths_name_where_the_lone_half_was() -> None:
    raw = rb'{"ops":[{"entry":{"id":"e1","m":{"c":[{"t":"ok"},{"t":"x\ud83d"}]}}}]}'
    paths = codec.lone_surrogate_paths(raw)
    assert paths == [("ops", 0, "entry", "m", "c", 1, "t")]
    assert codec.format_path(paths[0][3:]) == "m.c[1].t"


# -- JSONL -------------------------------------------------------------------------------------


def test_jsonl_lone_surrogate_in_text_args_and_details_loads_with_warning(tmp_path: Path) -> None:
    """A lone high half in a message text, a lone low half in tool arguments and one in a tool
    result's details: every entry loads with U+FFFD, one warning per entry names it, and the
    file's bytes are unchanged by opening it (read-only and writable)."""
    store = open_store(f"jsonl:{tmp_path}")
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1", message={"content": [{"type": "text", "text": "hi MARK1"}]}))])
    s.commit(
        [
            EntryOp(ent("e2", "e1", arguments={"path": "a.txt", "text": "MARK2 end"})),
            RecordOp(rec("r1", note="MARK4")),
        ]
    )
    s.commit([EntryOp(ent("e3", "e2", details={"stdout": ["x", "MARK3"]}), lane="main")])
    s.commit([EntryOp(ent("e4", "e3", text="clean \U0001f600"), lane="main")])
    path = Path(s.location)
    sid = s.session_id
    s.close()
    data = _replace(
        path, {b"MARK1": HIGH, b"MARK2": LOW, b"MARK3": b"a" + HIGH + b"b", b"MARK4": HIGH}
    )
    for write in (False, True):
        opened = store.open_session(sid, write=write)
        try:
            assert opened.get_entry("e1")["message"]["content"][0]["text"] == "hi \ufffd"
            assert opened.get_entry("e2")["arguments"]["text"] == "\ufffd end"
            assert opened.get_entry("e3")["details"]["stdout"] == ["x", "a\ufffdb"]
            assert opened.get_entry("e4")["text"] == "clean \U0001f600"
            assert [r.get("note") for r in opened.records() if r["id"] == "r1"] == ["\ufffd"]
            warnings = _warnings(opened.damage)
            assert sorted(w["id"] for w in warnings) == ["e1", "e2", "e3", "r1"]
            assert all(w["kind"] in WARNING_KINDS for w in opened.damage)  # nothing else
            by_id = {w["id"]: w for w in warnings}
            assert "entry e1" in by_id["e1"]["detail"]
            assert "message.content[0].text" in by_id["e1"]["detail"]
            assert "arguments.text" in by_id["e2"]["detail"]
            assert "details.stdout[1]" in by_id["e3"]["detail"]
            assert "record r1" in by_id["r1"]["detail"]
            assert by_id["e1"]["line"] == 2 and isinstance(by_id["e1"]["offset"], int)
        finally:
            opened.close()
    assert path.read_bytes() == data


def test_jsonl_session_with_lone_surrogate_stays_writable(tmp_path: Path) -> None:
    """New commits after a repaired line append normally and reload."""
    store = open_store(f"jsonl:{tmp_path}")
    s = store.create_session("/p")
    s.commit([EntryOp(ent("e1", text="MARK"), lane="main")])
    sid, path = s.session_id, Path(s.location)
    s.close()
    _replace(path, {b"MARK": HIGH})
    s = store.open_session(sid)
    s.commit([EntryOp(ent("e2", "e1", text=s.get_entry("e1")["text"] + "!"), lane="main")])
    s.close()
    again = store.open_session(sid, write=False)
    assert again.get_entry("e2")["text"] == "\ufffd!"
    assert [w["id"] for w in _warnings(again.damage)] == ["e1"]
    assert rb"\ud83d" in path.read_bytes()  # the old line is still as it was
    again.close()


def test_jsonl_session_api_reads_repaired_entry(tmp_path: Path) -> None:
    store = open_store(f"jsonl:{tmp_path}")
    s = store.create_session("/p")
    msg = {"role": "user", "content": [{"type": "text", "text": "cut MARK"}], "timestamp": 1}
    s.commit(
        [
            EntryOp(
                {
                    "type": "message",
                    "id": "m1",
                    "parentId": None,
                    "timestamp": "2026-01-01T00:00:00.000Z",
                    "message": msg,
                },
                lane="main",
            )
        ]
    )
    path = Path(s.location)
    s.close()
    _replace(path, {b"MARK": HIGH})
    session = open_session(str(path), store)
    assert isinstance(session.store, JsonlSessionStore)
    assert session.context().messages[0]["content"][0]["text"] == "cut \ufffd"
    assert [w["id"] for w in _warnings(session.damage)] == ["m1"]


# -- pi files ----------------------------------------------------------------------------------


def _pi_file(path: Path, version: int | None, lines: list[dict[str, Any]]) -> None:
    header: dict[str, Any] = {"type": "session", "id": "pi-1", "timestamp": "t", "cwd": "/p"}
    if version is not None:
        header["version"] = version
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in [header, *lines]))


@pytest.mark.parametrize("version", [3, None])
def test_pi_lone_surrogate_loads_with_warning_naming_the_entry(
    tmp_path: Path, version: int | None
) -> None:
    def msg(eid: str, parent: str | None, message: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "timestamp": "t", "message": message}
        if version is not None:
            out |= {"id": eid, "parentId": parent}
        return out

    path = tmp_path / "pi.jsonl"
    _pi_file(
        path,
        version,
        [
            msg("a1", None, {"role": "user", "content": [{"type": "text", "text": "MARKA"}]}),
            msg(
                "a2",
                "a1",
                {
                    "role": "assistant",
                    "content": [
                        {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"x": "MB"}}
                    ],
                },
            ),
            msg(
                "a3",
                "a2",
                {
                    "role": "toolResult",
                    "toolCallId": "c1",
                    "toolName": "bash",
                    "content": [{"type": "text", "text": "ok"}],
                    "details": {"out": "MARKC"},
                },
            ),
        ],
    )
    data = _replace(path, {b"MARKA": HIGH, b'"MB"': b'"' + LOW + b'"', b"MARKC": HIGH + HIGH})
    store = open_pi_file(str(path))
    entries = store.iter_entries()
    assert entries[0]["message"]["content"][0]["text"] == "\ufffd"
    assert entries[1]["message"]["content"][0]["arguments"] == {"x": "\ufffd"}
    assert entries[2]["message"]["details"] == {"out": "\ufffd\ufffd"}
    warnings = _warnings(store.damage)
    assert [w["id"] for w in warnings] == [e["id"] for e in entries]
    assert [w["line"] for w in warnings] == [2, 3, 4]
    assert f"entry {entries[1]['id']}" in warnings[1]["detail"]
    assert "message.content[0].arguments.x" in warnings[1]["detail"]
    assert all(d["kind"] in WARNING_KINDS for d in store.damage)
    assert path.read_bytes() == data


def test_standard_library_agrees_on_which_strings_hold_lone_halves() -> None:
    """The path finder reads with ``json`` (which keeps lone halves); check it on a mix."""
    raw = rb'{"a":["ok","\udfff"],"b":{"c":"\ud83d\ude00"}}'
    assert json.loads(raw)["a"][1] == "\udfff"
    assert codec.lone_surrogate_paths(raw) == [("a", 1)]


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "memory"])
def test_a_lone_surrogate_committed_reads_back_as_stored_before_and_after_reopen(
    backend: str, tmp_path: Path
) -> None:
    """A Python string with a lone half (from ``surrogateescape``, or a JSON body's
    ``\\udc00``) is written with U+FFFD; the writer's own reads give what was written, not the
    raw half, so the session reads the same before and after a reopen (and serialises)."""
    spec = {"jsonl": f"jsonl:{tmp_path / 'j'}", "sqlite": f"sqlite:{tmp_path / 's.db'}"}
    store = open_store(spec.get(backend, "memory:"))
    session = store.create_session(str(tmp_path))
    session.commit(
        [
            EntryOp(ent("e1", None, text="a\udc00b"), lane="main"),
            RecordOp({**rec("r1", "note"), "prompt": "a\udc00b", "x\ud800": 1}),
        ]
    )
    want = {"prompt": "a\ufffdb", "x\ufffd": 1}
    (got,) = session.records()
    assert {k: got[k] for k in want} == want
    orjson.dumps(got)  # a front can serialise what the store returns
    assert session.get_entry("e1")["text"] == "a\ufffdb"  # type: ignore[index]
    session.close()
    if backend != "memory":
        with store.open_session(session.session_id, write=False) as again:
            (stored,) = again.records()
            assert {k: stored[k] for k in want} == want
