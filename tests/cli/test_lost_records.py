"""A run SIGKILLed after its ``append_file`` effect, then its store damaged by hand: the
``tool_started`` row deleted or its body corrupted (SQLite), the header line deleted or the file
cut cleanly before the ``tool_started`` line (JSONL), a commit lost from the middle (both).
``fsck`` names the damage and where it is, ``fsck --json`` says ``"ok": false``, the recovery
plan does not ``execute`` the call, and ``resume`` does not append a second time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest import forkserver
from durable_harness.storage import open_store

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

TURNS = [
    {
        "text": "Recording.",
        "tool_calls": [
            {"name": "append_file", "arguments": {"path": "effects.log", "content": "d1\n"}}
        ],
    },
    {"text": "done"},
]


def _dh(*args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DURABLE_HARNESS_CRASH_AT", "DURABLE_HARNESS_CRASH_TRACE")
    }
    if crash_at:
        env["DURABLE_HARNESS_CRASH_AT"] = crash_at
    # a child forked with the CLI warm: no interpreter start (issue 22)
    return forkserver.run_cli(list(args), env=env, cwd=os.getcwd(), timeout=120)


def _crashed(tmp_path: Path, backend: str) -> tuple[str, str, Path]:
    """A run killed right after its append_file effect: ``(session id, store spec, work)``."""
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": TURNS}))
    spec = f"jsonl:{tmp_path / 'home'}" if backend == "jsonl" else f"sqlite:{tmp_path / 's.db'}"
    proc = _dh(
        "run",
        "go",
        "--provider",
        f"scripted:{script}",
        "--store",
        spec,
        "--cwd",
        str(work),
        crash_at="after_tool_effect",
    )
    assert proc.returncode == -9, proc.stderr
    (sid,) = [ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("session ")]
    assert _appended(work) == 1
    return sid, spec, work


def _appended(work: Path) -> int:
    log = work / "effects.log"
    return log.read_text().count("d1") if log.exists() else 0


def _db(spec: str) -> str:
    return spec.removeprefix("sqlite:")


def _sqlite_row(spec: str, sid: str, rtype: str) -> tuple[str, int]:
    conn = sqlite3.connect(_db(spec))
    row = conn.execute(
        "SELECT id, seq FROM records WHERE session_id=? AND type=?", (sid, rtype)
    ).fetchone()
    conn.close()
    return str(row[0]), int(row[1])


def _sql(spec: str, sql: str, *args: Any) -> None:
    conn = sqlite3.connect(_db(spec))
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def _jsonl_path(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "home").rglob("*.jsonl")
    return path


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().rstrip(b"\n").split(b"\n")


def _index(lines: list[bytes], needle: bytes) -> int:
    (i,) = [n for n, line in enumerate(lines) if needle in line]
    return i


# Each damage: (backend, how to damage the store, what fsck must report about it)
Damager = Callable[[Path, str, str], list[tuple[Any, ...]]]


def _sqlite_delete_tool_started(tmp_path: Path, spec: str, sid: str) -> list[tuple[Any, ...]]:
    rid, seq = _sqlite_row(spec, sid, "tool_started")
    _sql(spec, "DELETE FROM records WHERE id=?", rid)
    with open_store(spec).open_session(sid, write=False) as s:
        last = s.last_seq()
    if seq == last:
        return [("truncated", "sessions", last, last - 1)]
    return [("seq_gap", seq - 1, seq + 1)]


def _sqlite_corrupt_tool_started(tmp_path: Path, spec: str, sid: str) -> list[tuple[Any, ...]]:
    rid, seq = _sqlite_row(spec, sid, "tool_started")
    _sql(spec, "UPDATE records SET body=? WHERE id=?", b'{"type":"tool_sta\x00', rid)
    return [("bad_row", "records", rid, seq)]


def _sqlite_delete_request_started(tmp_path: Path, spec: str, sid: str) -> list[tuple[Any, ...]]:
    rid, seq = _sqlite_row(spec, sid, "provider_request_started")
    _sql(spec, "DELETE FROM records WHERE id=?", rid)
    return [("seq_gap", seq - 1, seq + 1)]


def _jsonl_delete_header(tmp_path: Path, spec: str, sid: str) -> list[tuple[Any, ...]]:
    path = _jsonl_path(tmp_path)
    path.write_bytes(b"\n".join(_lines(path)[1:]) + b"\n")
    return [("missing_header", 0, 1)]


def _jsonl_cut_before_tool_started(tmp_path: Path, spec: str, sid: str) -> list[tuple[Any, ...]]:
    path = _jsonl_path(tmp_path)
    lines = _lines(path)
    i = _index(lines, b'"tool_started"')
    assert i == len(lines) - 1, "the intent is the last commit before the crash"
    seqs = [op_seq for op_seq in _seqs(lines[i])]
    cut = len(b"\n".join(lines[:i])) + 1
    path.write_bytes(path.read_bytes()[:cut])  # a clean cut at a line boundary
    return [("truncated", seqs[-1], seqs[0] - 1, cut, i + 1)]


def _jsonl_delete_request_started(tmp_path: Path, spec: str, sid: str) -> list[tuple[Any, ...]]:
    path = _jsonl_path(tmp_path)
    lines = _lines(path)
    i = _index(lines, b'"provider_request_started"')
    (lost,) = _seqs(lines[i])
    del lines[i]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return [("seq_gap", lost - 1, lost + 1, i + 1)]


def _seqs(line: bytes) -> list[int]:
    ops = json.loads(line)["ops"]
    return [(op.get("entry") or op.get("record") or op)["seq"] for op in ops]


FIELDS = {
    "truncated": ("table", "expected", "found"),
    "bad_row": ("table", "id", "seq"),
    "seq_gap": ("after", "seq"),
    "missing_header": ("offset", "line"),
}
JSONL_FIELDS = {
    "truncated": ("expected", "found", "offset", "line"),
    "seq_gap": ("after", "seq", "line"),
}

CASES: list[tuple[str, Damager]] = [
    ("sqlite", _sqlite_delete_tool_started),
    ("sqlite", _sqlite_corrupt_tool_started),
    ("sqlite", _sqlite_delete_request_started),
    ("jsonl", _jsonl_delete_header),
    ("jsonl", _jsonl_cut_before_tool_started),
    ("jsonl", _jsonl_delete_request_started),
]


@pytest.mark.parametrize(
    ("backend", "damager"), CASES, ids=[f"{b}-{d.__name__.strip('_')}" for b, d in CASES]
)
def test_lost_or_altered_record_is_named_and_nothing_runs_twice(
    tmp_path: Path, backend: str, damager: Damager
) -> None:
    sid, spec, work = _crashed(tmp_path, backend)
    want = damager(tmp_path, spec, sid)

    # fsck by session id, as the other commands take it: kind and location, ok false, exit 1
    res = _dh("fsck", sid, "--store", spec, "--json")
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] is False
    fields = JSONL_FIELDS if backend == "jsonl" else FIELDS
    got = [
        (d["kind"], *(d.get(k) for k in fields.get(d["kind"], FIELDS[d["kind"]])))
        for d in report["damage"]
        if d["kind"] != "orphan_parent"  # a lost entry may orphan the next one too
    ]
    assert got == want
    human = _dh("fsck", sid, "--store", spec)
    assert human.returncode == 1 and want[0][0] in human.stdout

    # the store reports the same damage to recovery (one scan), and the plan printed by
    # `recover --json` never executes the replay-never call
    with open_store(spec).open_session(sid, write=False) as store:
        assert [d["kind"] for d in store.damage if d["kind"] != "orphan_parent"] == [
            w[0] for w in want
        ]
    rec = _dh("recover", sid, "--store", spec, "--json")
    assert rec.returncode == 0, rec.stderr
    recovery = json.loads(rec.stdout)
    assert [d["kind"] for d in recovery["damage"] if d["kind"] != "orphan_parent"] == [
        w[0] for w in want
    ]
    calls = [c for lp in recovery["lanes"] for c in lp["tool_calls"]]
    assert calls and all(c["tool_name"] == "append_file" for c in calls)
    assert all(c["action"] != "execute" for c in calls), calls

    # and resuming does not append a second time
    resumed = _dh("resume", sid, "--store", spec, "--quiet")
    assert resumed.returncode in (0, 5), resumed.stdout + resumed.stderr
    assert _appended(work) == 1


def test_fsck_on_what_is_not_a_store_or_session_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from durable_harness.cli.main import main

    folder = tmp_path / "random"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"hello": "world"}\n')
    for target, code in ((folder, "not_a_store"), (notes, "not_a_session")):
        capsys.readouterr()
        assert main(["fsck", str(target), "--json"]) == 2
        assert json.loads(capsys.readouterr().out)["error"]["code"] == code
        assert main(["fsck", str(target)]) == 2
        assert f"error[{code}]" in capsys.readouterr().err
    assert sorted(os.listdir(folder)) == ["a.txt"]
