"""``fsck_path``: a read-only integrity check that reports damage and never raises."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_harness.errors import NotASession, NotAStore, SessionNotFound
from durable_harness.recovery.fsck import fsck_path
from durable_harness.storage import EntryOp, RecordOp, open_store

OWN_HEADER = b'{"type":"session","version":3,"format":"durable-harness/1","id":"s1","cwd":"/p"}\n'
PI_HEADER = b'{"type":"session","version":3,"id":"s2","timestamp":"t","cwd":"/p"}\n'


def _entry(eid: str, parent: str | None) -> dict[str, Any]:
    return {"type": "custom", "customType": "t", "id": eid, "parentId": parent}


def _session(tmp_path: Path) -> str:
    s = open_store(f"jsonl:{tmp_path}").create_session("/p")
    s.commit([EntryOp(_entry("e1", None), lane="main"), RecordOp({"type": "n", "id": "r1"})])
    s.commit([EntryOp(_entry("e2", "e1"), lane="main"), RecordOp({"type": "n", "id": "r2"})])
    s.commit([RecordOp({"type": "n", "id": "r3"})])
    path = s.location
    s.close()
    return path


def test_clean_file(tmp_path: Path) -> None:
    path = _session(tmp_path)
    result = fsck_path(path)
    assert result["ok"] is True
    assert result["damage"] == []
    assert (result["entries"], result["records"]) == (2, 3)
    assert result["format"] == "durable-harness/jsonl"
    json.dumps(result)  # the CLI prints it as JSON


def test_damaged_file_reports_offsets_and_modifies_nothing(tmp_path: Path) -> None:
    path = _session(tmp_path)
    good = Path(path).read_bytes()
    second_line = good.index(b"\n") + 1
    third_line = good.index(b"\n", second_line) + 1
    damaged = good[:third_line] + b"\x00garbage\n" + good[third_line:] + b'{"gen":1,"op'
    Path(path).write_bytes(damaged)
    digest = hashlib.sha256(damaged).hexdigest()
    result = fsck_path(path)
    assert result["ok"] is False
    assert [(d["kind"], d["offset"]) for d in result["damage"]] == [
        ("bad_line", third_line),
        ("torn_tail", len(good) + len(b"\x00garbage\n")),
    ]
    assert (result["entries"], result["records"]) == (2, 3)
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in Path(path).parent.iterdir()) == [
        Path(path).name,
        Path(path).name + ".lock",
    ]  # no quarantine side file


def test_pi_file(pi_dir: Path) -> None:
    path = pi_dir / "v3-branched.jsonl"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    result = fsck_path(str(path))
    assert result["ok"] is True
    assert result["format"] == "pi"
    assert (result["entries"], result["records"]) == (17, 0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_sqlite_database(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = open_store(f"sqlite:{db}")
    for n in range(2):
        s = store.create_session(f"/p{n}")
        s.commit([EntryOp(_entry(f"e{n}", None), lane="main"), RecordOp({"type": "n", "id": "r"})])
        s.close()
    result = fsck_path(str(db))
    assert result["ok"] is True
    assert result["format"] == "sqlite"
    assert (result["entries"], result["records"]) == (2, 2)

    # An orphan can only come from outside the store: inject one directly.
    conn = sqlite3.connect(db)
    sid = conn.execute("SELECT id FROM sessions LIMIT 1").fetchone()[0]
    body = json.dumps({**_entry("orphan", "ghost"), "seq": 3}).encode()
    conn.execute(
        "INSERT INTO entries (session_id, id, seq, parent_id, type, body) VALUES (?,?,?,?,?,?)",
        (sid, "orphan", 3, "ghost", "custom", body),
    )
    conn.execute("UPDATE sessions SET last_seq=3 WHERE id=?", (sid,))
    conn.commit()
    conn.close()
    result = fsck_path(str(db))
    assert result["ok"] is False
    assert [
        (d["kind"], d["table"], d["id"], d["seq"], d["session_id"]) for d in result["damage"]
    ] == [("orphan_parent", "entries", "orphan", 3, sid)]


def test_missing_path_and_not_a_session(tmp_path: Path) -> None:
    with pytest.raises(SessionNotFound):
        fsck_path(str(tmp_path / "nope.jsonl"))

    other = tmp_path / "other.jsonl"
    other.write_bytes(b'{"hello": "world"}\n')
    with pytest.raises(NotASession, match=r"other\.jsonl is not a session file"):
        fsck_path(str(other))

    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(NotASession):
        fsck_path(str(empty))

    fake_db = tmp_path / "fake.db"
    fake_db.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    result = fsck_path(str(fake_db))
    assert result["ok"] is False and result["format"] == "sqlite"


def test_malformed_pi_fields_are_damage_not_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "pi.jsonl"
    path.write_bytes(
        PI_HEADER
        + b'{"type":"message","id":"a","parentId":null,"message":{"role":"user","content":"x"}}\n'
        + b'{"type":"message","id":"b","parentId":{"not":"a string"}}\n'
    )
    result = fsck_path(str(path))
    assert result["ok"] is False
    assert [(d["kind"], d["id"]) for d in result["damage"]] == [("bad_line", "b")]
    assert result["entries"] == 1

    path.write_bytes(b'{"type":"session","version":"two","id":"s","cwd":"/p"}\n')
    result = fsck_path(str(path))
    assert result["ok"] is False
    assert [d["kind"] for d in result["damage"]] == ["bad_header"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
# JSON lines shaped like commits or pi entries, with fields of any type in any place.
_op_like = st.fixed_dictionaries(
    {"op": st.sampled_from(["entry", "record", "lane", "x"])},
    optional={
        "entry": st.fixed_dictionaries(
            {"id": st.text(max_size=2) | _json, "seq": st.integers(0, 9) | _json},
            optional={"parentId": _json, "type": _json},
        ),
        "record": st.fixed_dictionaries(
            {"id": st.text(max_size=2) | _json, "seq": st.integers(0, 9) | _json},
            optional={"lane": _json, "type": _json, "runId": _json},
        ),
        "lane": _json,
        "leafId": _json,
        "config": _json,
        "seq": _json,
    },
)
_structured_line = st.one_of(
    st.fixed_dictionaries({"gen": _json, "ops": st.lists(_op_like, max_size=3) | _json}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "compaction", "label"]), "id": st.text() | _json},
        optional={"parentId": _json, "message": _json, "firstKeptEntryIndex": _json},
    ),
    _json,
).map(lambda v: json.dumps(v).encode())
_body = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(st.binary(max_size=20), _structured_line), max_size=6).map(b"\n".join),
)


@pytest.mark.slow
@given(header=st.sampled_from([OWN_HEADER, PI_HEADER]), body=_body)
def test_never_raises_on_random_content(header: bytes, body: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "random.jsonl")
        Path(path).write_bytes(header + body)
        result = fsck_path(path)
        assert isinstance(result["ok"], bool)
        assert result["ok"] == (result["damage"] == [])
        for item in result["damage"]:
            assert isinstance(item["kind"], str)
            assert "offset" in item or "line" in item or "id" in item
        json.dumps(result)
        assert Path(path).read_bytes() == header + body
        assert os.listdir(tmp) == ["random.jsonl"]


def test_a_store_folder_is_checked_file_by_file(tmp_path: Path) -> None:
    from durable_harness.storage import open_store
    from durable_harness.storage.base import EntryOp

    store = open_store(f"jsonl:{tmp_path / 'home'}")
    paths = []
    for _ in range(2):
        s = store.create_session("/work")
        s.commit(
            [
                EntryOp(
                    {
                        "type": "custom",
                        "id": "e1",
                        "parentId": None,
                        "timestamp": "2026-01-01T00:00:00.000Z",
                        "customType": "x",
                    }
                )
            ]
        )
        paths.append(s.location)
        s.close()
    clean = fsck_path(f"jsonl:{tmp_path / 'home'}")
    assert clean["ok"] is True and clean["entries"] == 2 and len(clean["files"]) == 2
    with open(paths[1], "ab") as fh:
        fh.write(b"garbage without newline")
    damaged = fsck_path(str(tmp_path / "home"))
    assert damaged["ok"] is False
    assert [d["path"] for d in damaged["damage"]] == [paths[1]]


def test_sqlite_rows_that_are_not_json_are_reported_not_raised(tmp_path: Path) -> None:
    import sqlite3

    from durable_harness.storage import open_store
    from durable_harness.storage.base import EntryOp, RecordOp

    db = tmp_path / "s.db"
    store = open_store(f"sqlite:{db}")
    s = store.create_session("/w")
    sid = s.session_id
    s.commit(
        [
            EntryOp(
                {"type": "custom", "id": "e0", "parentId": None, "customType": "x"}, lane="main"
            ),
            RecordOp({"type": "note", "id": "r0", "lane": "main"}),
        ]
    )
    s.commit([RecordOp({"type": "note", "id": "r1", "lane": "main"})])
    s.close()
    conn = sqlite3.connect(db)
    conn.execute("UPDATE records SET body=? WHERE id='r0'", (b'{"garbage',))
    conn.commit()
    conn.close()
    reopened = store.open_session(sid, write=False)
    assert [r["id"] for r in reopened.records()] == ["r1"]
    assert [d["kind"] for d in reopened.damage] == ["bad_row"]
    reopened.close()


def test_a_pi_entry_of_the_wrong_shape_is_reported_and_skipped(tmp_path: Path) -> None:
    from durable_harness.session.pi import open_pi_file

    f = tmp_path / "pi.jsonl"
    f.write_text(
        '{"type":"session","version":3,"id":"s","timestamp":"t","cwd":"/w"}\n'
        '{"type":"message","id":"a1","parentId":null,"timestamp":"t",'
        '"message":{"role":"user","content":"hi"}}\n'
        '{"type":"label","id":"a2","parentId":"a1","timestamp":"t","targetIc":"a1"}\n'
    )
    store = open_pi_file(str(f))
    assert [e["id"] for e in store.iter_entries()] == ["a1"]
    assert [d["kind"] for d in store.damage] == ["bad_line"]


# -- lost or altered records: fsck names the store's own damage with its location -----------


def _sqlite_session(tmp_path: Path) -> tuple[str, str]:
    db = str(tmp_path / "s.db")
    s = open_store(f"sqlite:{db}").create_session("/p")
    s.commit([EntryOp(_entry("e1", None), lane="main"), RecordOp({"type": "n", "id": "r1"})])
    s.commit(
        [RecordOp({"type": "tool_started", "id": "t1", "toolCallId": "c1", "toolName": "bash"})]
    )
    s.commit([RecordOp({"type": "n", "id": "r3"})])
    sid = s.session_id
    s.close()
    return db, sid


def _sql(db: str, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(db)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def _where(result: dict[str, Any], *keys: str) -> list[tuple[Any, ...]]:
    return [tuple(d.get(k) for k in ("kind", *keys)) for d in result["damage"]]


def test_sqlite_deleted_tool_started_row_is_a_seq_gap(tmp_path: Path) -> None:
    db, sid = _sqlite_session(tmp_path)
    _sql(db, "DELETE FROM records WHERE id='t1'")
    for target in (db, f"sqlite:{db}", f"sqlite:{db}#{sid}"):
        result = fsck_path(target)
        assert result["ok"] is False
        assert _where(result, "after", "seq", "table", "id", "session_id") == [
            ("seq_gap", 2, 4, "records", "r3", sid)
        ]


def test_sqlite_corrupt_row_body_is_seen_by_fsck_with_its_seq(tmp_path: Path) -> None:
    db, sid = _sqlite_session(tmp_path)
    _sql(db, "UPDATE records SET body=? WHERE id='t1'", b'{"type":"tool_st')
    result = fsck_path(db)
    assert result["ok"] is False
    assert _where(result, "table", "id", "seq") == [("bad_row", "records", "t1", 3)]
    # the same item the store reports to recovery: one scan, one answer
    with open_store(f"sqlite:{db}").open_session(sid, write=False) as s:
        assert [{**d, "session_id": sid} for d in s.damage] == result["damage"]


def test_jsonl_deleted_header_and_clean_cut_are_named(tmp_path: Path) -> None:
    path = _session(tmp_path)
    data = Path(path).read_bytes()
    lines = data.rstrip(b"\n").split(b"\n")
    Path(path).write_bytes(b"\n".join(lines[1:]) + b"\n")
    result = fsck_path(path)
    assert result["ok"] is False and result["entries"] == 2 and result["records"] == 3
    assert _where(result, "offset", "line") == [("missing_header", 0, 1)]

    cut = len(b"\n".join(lines[:3])) + 1  # header and two commits: the last commit cut off
    Path(path).write_bytes(data[:cut])
    result = fsck_path(path)
    assert result["ok"] is False
    assert _where(result, "expected", "found", "offset", "line") == [("truncated", 5, 4, cut, 4)]


def test_jsonl_deleted_interior_line_is_a_seq_gap(tmp_path: Path) -> None:
    path = _session(tmp_path)
    lines = Path(path).read_bytes().rstrip(b"\n").split(b"\n")
    del lines[2]  # e2 + r2: seqs 3 and 4
    Path(path).write_bytes(b"\n".join(lines) + b"\n")
    result = fsck_path(path)
    assert _where(result, "after", "seq", "line") == [("seq_gap", 2, 5, 3)]


def test_fsck_by_session_id_on_both_backends(tmp_path: Path) -> None:
    from durable_harness.recovery.fsck import fsck_session

    path = _session(tmp_path / "j")
    jstore = open_store(f"jsonl:{tmp_path / 'j'}")
    (info,) = jstore.list_sessions()
    assert fsck_session(info.id[:8], jstore)["path"] == path
    db, sid = _sqlite_session(tmp_path)
    result = fsck_session(sid[:8], open_store(f"sqlite:{db}"))
    assert result["ok"] is True and result["sessions"] == 1 and result["records"] == 3
    with pytest.raises(SessionNotFound):
        fsck_session("nomatch", jstore)


def test_a_folder_that_is_not_a_store_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "random").mkdir()
    (tmp_path / "random" / "notes.txt").write_text("hello")
    (tmp_path / "random" / "data.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(NotAStore, match="not a session store") as info:
        fsck_path(str(tmp_path / "random"))
    assert info.value.code == "not_a_store"
    # inside a real store, a stray file is damage of the store, not an error
    _session(tmp_path / "home")
    stray = tmp_path / "home" / "sessions" / "stray.jsonl"
    stray.write_text("not json\n")
    result = fsck_path(str(tmp_path / "home"))
    assert result["ok"] is False
    assert [(d["kind"], d["path"]) for d in result["damage"]] == [("not_a_session", str(stray))]


def test_a_sqlite_database_that_is_not_a_store_is_a_typed_error(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(NotAStore):
        fsck_path(str(db))
    assert sorted(os.listdir(tmp_path)) == before  # read-only: nothing created


def test_damage_location_words() -> None:
    from durable_harness.recovery.fsck import damage_location

    assert damage_location({"offset": 10, "line": 2}) == "offset 10 (line 2)"
    assert damage_location({"seq": 4, "table": "records", "id": "r3"}) == "seq 4 (records r3)"
    assert damage_location({"id": "x"}) == "id x"


@pytest.mark.crash
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_fsck_and_recover_report_the_same_damage(backend: str, tmp_path: Path) -> None:
    """One list: storage damage plus the lane findings (here a ``tool_started`` that names no
    call of its run), identical in ``fsck --json`` and ``recover --json``; the run's unsettled
    replay-never call is then in doubt and waits."""
    import signal

    from durable_harness.harness.records import record

    from .helpers import dh, main_lane, session_id, store_spec, write_script

    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    turns = [
        {"text": "t", "tool_calls": [{"name": "append_file",
                                      "arguments": {"path": "e.log", "content": "x\n"}}]},
        {"text": "done"},
    ]  # fmt: skip
    script = write_script(tmp_path / "s.json", turns)
    first = dh(
        "run", "go", "--provider", f"scripted:{script}", "--store", spec, "--cwd", str(work),
        crash_at="after_assistant_entry",
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    sid = session_id(first)
    store = open_store(spec).open_session(sid, break_lease=True)
    run_id = store.lanes()["main"].run_id
    assert run_id is not None
    ghost = record(
        "tool_started", "main", run_id, toolCallId="ghost", callKey="nowhere/0", toolName="bash"
    )
    store.commit([RecordOp(ghost)])
    seq = store.last_seq()
    store.close()

    checked = dh("fsck", sid, "--json", "--store", spec)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    fsck_damage = json.loads(checked.stdout)["damage"]
    planned = dh("recover", sid, "--json", "--store", spec)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    strip = [{k: v for k, v in d.items() if k != "session_id"} for d in fsck_damage]
    assert strip == plan["damage"]
    assert [(d["kind"], d["seq"]) for d in plan["damage"]] == [("unknown_call", seq)]
    (call,) = main_lane(plan)["tool_calls"]
    assert (call["status"], call["doubt"], call["action"]) == (
        "in_doubt",
        "damaged_log",
        "await_decision",
    )
