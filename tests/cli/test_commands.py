"""The ``durable-harness`` commands, checked through what the library sees afterwards.

Most tests call ``main(argv)`` in this process; a few run ``python -m durable_harness`` as a
child process (a real second writer, real exit statuses). Every test has its own
``$DURABLE_HARNESS_HOME`` (see ``conftest.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crash import CRASH_POINTS
from durable_harness.session import Session
from durable_harness.storage import Store, open_store

from .conftest import SCRIPT, SCRIPT_TOTAL_COST, SCRIPT_TOTAL_TOKENS, Result

Cli = Callable[..., Result]

BRIEF_CRASH_POINTS = (
    "after_run_started",
    "after_provider_request_started",
    "mid_provider_stream",
    "after_assistant_entry",
    "after_tool_started",
    "after_tool_effect",
    "after_tool_finished",
    "before_save_point",
    "after_abort_requested",
    "before_run_finished",
)
PROMPT = "Read the notes and write a summary"


def run_session(
    cli: Cli, script: Path, project: Path, *extra: str, store: str | None = None
) -> tuple[str, Result]:
    """Run :data:`PROMPT` in a new session; return its id (the only session) and the result."""
    store_args = ["--store", store] if store else []
    res = cli(
        "run",
        PROMPT,
        "--provider",
        f"scripted:{script}",
        "--cwd",
        str(project),
        *extra,
        *store_args,
    )
    assert res.code == 0, res.err
    listed = cli("sessions", "--json", *store_args).json()
    assert len(listed) == 1, listed
    return listed[0]["id"], res


def messages(store: Store, sid: str) -> list[dict[str, Any]]:
    """The message entries of a session, in seq order, read through the library."""
    with store.open_session(sid, write=False) as s:
        return [e for e in s.iter_entries() if e["type"] == "message"]


def assert_well_formed(ctx: list[dict[str, Any]]) -> None:
    """The brief's context contract: roles, toolCallId on results, one result per call, no empty
    assistant message, no result without its call."""
    assert isinstance(ctx, list) and ctx
    calls: list[str] = []
    results: Counter[str] = Counter()
    for m in ctx:
        assert m["role"] in ("user", "assistant", "toolResult"), m
        assert "content" in m
        if m["role"] == "assistant":
            assert m["content"], f"empty assistant message in context: {m}"
            calls += [c["id"] for c in m["content"] if c.get("type") == "toolCall"]
        if m["role"] == "toolResult":
            assert m.get("toolCallId"), m
            results[m["toolCallId"]] += 1
    assert sorted(results) == sorted(calls), (calls, dict(results))
    assert all(n == 1 for n in results.values()), dict(results)


# -- run, and what it leaves in the session ------------------------------------------------------


def test_run_creates_a_complete_session(cli: Cli, script: Path, project: Path) -> None:
    sid, res = run_session(cli, script, project)

    # streaming output: every turn's text, as deltas joined on the terminal, and the tools
    for turn in SCRIPT["turns"]:
        assert turn["text"] in res.out
    assert "[tool] read_file" in res.out and "[tool] bash" in res.out
    assert f"session {sid}" in res.err and "run completed" in res.err

    store = open_store()
    with store.open_session(sid, write=False) as s:
        assert s.header["cwd"] == str(project)
        entries = s.iter_entries()
        records = s.records()
        leaf = s.lanes()["main"].leaf_id
    msgs = [e["message"] for e in entries if e["type"] == "message"]
    assert msgs[0]["role"] == "user"
    assert msgs[0]["content"][0]["text"] == PROMPT
    assistants = [m for m in msgs if m["role"] == "assistant"]
    assert [a["content"][0]["text"] for a in assistants] == [t["text"] for t in SCRIPT["turns"]]
    results = {m["toolName"]: m for m in msgs if m["role"] == "toolResult"}
    assert set(results) == {"read_file", "bash", "write_file"}
    assert "remember the milk" in results["read_file"]["content"][0]["text"]
    assert not any(m["isError"] for m in results.values())
    assert leaf == entries[-1]["id"]

    finished = [r for r in records if r["type"] == "run_finished"]
    assert [r["outcome"] for r in finished] == ["completed"]
    assert sum(r["type"] == "tool_started" for r in records) == 3
    assert sum(r["type"] == "tool_finished" for r in records) == 3
    # the effects happened, once each
    assert (project / "effect.log").read_text() == "ran\n"
    assert (project / "summary.md").read_text() == "# Summary\n"


def test_run_quiet_prints_no_stream(cli: Cli, script: Path, project: Path) -> None:
    _sid, res = run_session(cli, script, project, "--quiet")
    assert SCRIPT["turns"][0]["text"] not in res.out
    assert "run completed" in res.err


def test_run_continues_a_session(cli: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    before = messages(open_store(), sid)
    res = cli("run", "Once more", "--provider", f"scripted:{script}", "--session", sid[:13])
    assert res.code == 0, res.err
    after = messages(open_store(), sid)
    assert after[: len(before)] == before
    assert after[len(before)]["message"]["content"][0]["text"] == "Once more"
    assert after[len(before)]["parentId"] == before[-1]["id"]
    assert len(cli("sessions", "--json").json()) == 1


# -- read-only commands ---------------------------------------------------------------------------


def test_sessions_json_lists_the_session(cli: Cli, script: Path, project: Path) -> None:
    assert cli("sessions", "--json").json() == []
    sid, _ = run_session(cli, script, project)
    listed = cli("sessions", "--json").json()
    assert [i["id"] for i in listed] == [sid]
    assert listed[0]["cwd"] == str(project)
    assert Path(listed[0]["path"]).is_file()
    assert [i.id for i in open_store().list_sessions(str(project))] == [sid]
    assert cli("sessions", "--json", "--cwd", "/nowhere").json() == []
    text = cli("sessions")
    assert text.code == 0 and sid in text.out


def test_show_json_and_tree(cli: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    with open_store().open_session(sid, write=False) as s:
        entries = s.iter_entries()
        leaf = s.lanes()["main"].leaf_id
    info = cli("show", sid, "--json").json()
    assert info["session_id"] == sid
    assert info["cwd"] == str(project)
    assert info["entries"] == len(entries)
    assert info["lanes"]["main"]["leaf_id"] == leaf
    assert info["damage"] == []

    with_tree = cli("show", sid, "--json", "--tree").json()
    assert [e["id"] for e in with_tree["tree"]] == [e["id"] for e in entries]

    tree = cli("show", sid, "--tree")
    assert tree.code == 0
    for e in entries:
        assert e["id"] in tree.out
    leaf_line = next(line for line in tree.out.splitlines() if line.strip().startswith(leaf))
    assert "<main>" in leaf_line
    # one branch, in seq order: a chain is not indented (only branch points are drawn)
    ids = [e["id"] for e in entries]
    rows = [line for line in tree.out.splitlines() if line.strip().split(" ")[0] in ids]
    assert [line.strip().split(" ")[0] for line in rows] == ids
    assert [len(line) - len(line.lstrip()) for line in rows] == [0] * len(ids)


def test_context_json_is_well_formed(cli: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    res = cli("context", sid, "--json")
    assert res.code == 0
    ctx = res.json()
    assert_well_formed(ctx)
    assert ctx[0]["role"] == "user"
    assert ctx[0]["content"][0]["text"] == PROMPT
    assert [m["role"] for m in ctx].count("toolResult") == 3
    assert ctx[-1]["role"] == "assistant"
    assert ctx[-1]["content"][0]["text"] == SCRIPT["turns"][-1]["text"]
    # exactly the library's context from the lane's leaf
    with open_store().open_session(sid, write=False) as store:
        assert ctx == json.loads(json.dumps(Session(store).context().messages))
    text = cli("context", sid)
    assert text.code == 0 and PROMPT in text.out


def test_context_from_another_leaf(cli: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    msgs = messages(open_store(), sid)
    first_assistant = next(e for e in msgs if e["message"]["role"] == "assistant")
    ctx = cli("context", sid, "--leaf", first_assistant["id"], "--json").json()
    assert_well_formed(ctx)
    texts = json.dumps(ctx)
    assert SCRIPT["turns"][0]["text"] in texts
    assert SCRIPT["turns"][1]["text"] not in texts
    # the results of the leaf's calls lie beyond it: synthetic "interrupted" results stand in
    assert [m["role"] for m in ctx] == ["user", "assistant", "toolResult", "toolResult"]
    assert all("interrupted" in m["content"][0]["text"] for m in ctx[2:])

    only_prompt = cli("context", sid, "--leaf", msgs[0]["id"], "--json").json()
    assert [m["role"] for m in only_prompt] == ["user"]

    bad = cli("context", sid, "--leaf", "no-such-entry")
    assert bad.code == 2 and "error[unknown_entry]" in bad.err


def test_log_json_rows(cli: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    rows = cli("log", sid, "--json").json()
    with open_store().open_session(sid, write=False) as s:
        records = s.records()
    assert [(r["seq"], r["type"]) for r in rows] == [(r["seq"], r["type"]) for r in records]
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(set(seqs))
    types = [r["type"] for r in rows]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert {"provider_request_started", "tool_started", "save_point"} <= set(types)
    unknown = cli("log", sid, "--json", "--lane", "other")  # an unknown lane is an error
    assert unknown.code == 2
    assert unknown.json()["error"]["code"] == "unknown_lane"
    assert unknown.json()["error"]["lanes"] == ["main"]
    assert "run_finished" in cli("log", sid).out


def test_cost_json_totals_match_the_script(cli: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    report = cli("cost", sid, "--json").json()
    assert report["total"]["cost"] == pytest.approx(SCRIPT_TOTAL_COST)
    assert report["total"]["tokens"] == SCRIPT_TOTAL_TOKENS
    assert [t["turn"] for t in report["turns"]] == [1, 2, 3]
    assert len(report["runs"]) == 1
    assert report["runs"][0]["cost"] == pytest.approx(SCRIPT_TOTAL_COST)
    assert report["unknown_cost_attempts"] == 0
    # and the library's assistant entries carry the same usage
    usage = [
        e["message"]["usage"]["cost"]["total"]
        for e in messages(open_store(), sid)
        if e["message"]["role"] == "assistant"
    ]
    assert [t["cost"] for t in report["turns"]] == pytest.approx(usage)
    assert "total" in cli("cost", sid).out


# -- pi sessions -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["v3-branched.jsonl", "before-compaction.jsonl", "large-session.jsonl"]
)
def test_import_pi_file_keeps_the_context(cli: Cli, pi_sessions: Path, name: str) -> None:
    path = pi_sessions / name
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    in_place = cli("context", str(path), "--json")
    assert in_place.code == 0, in_place.err

    imported = cli("import", str(path), "--json")
    assert imported.code == 0, imported.err
    sid = imported.json()["session_id"]
    assert [i.id for i in open_store().list_sessions()] == [sid]
    with open_store().open_session(sid, write=False) as s:
        assert s.header["importedFrom"] == str(path)
        assert s.lanes()["main"].leaf_id == s.iter_entries()[-1]["id"]

    from_store = cli("context", sid, "--json")
    assert from_store.code == 0, from_store.err
    assert from_store.json() == in_place.json()
    assert_well_formed(from_store.json())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, "the pi file was modified"
    text = cli("import", str(path))
    assert text.code == 0 and "imported" in text.out


def test_import_missing_file(cli: Cli, tmp_path: Path) -> None:
    res = cli("import", str(tmp_path / "nope.jsonl"))
    assert res.code == 2 and "error[session_not_found]" in res.err
    assert open_store().list_sessions() == []


# -- fsck --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fsck_clean_then_damaged(cli: Cli, sh: Cli, script: Path, project: Path) -> None:
    sid, _ = run_session(cli, script, project)
    path = Path(open_store().resolve(sid).path)
    clean = cli("fsck", str(path), "--json")
    assert clean.code == 0
    report = clean.json()
    assert {"ok", "damage", "entries", "records"} <= set(report)
    assert report["ok"] is True and report["damage"] == []
    with open_store().open_session(sid, write=False) as s:
        assert report["entries"] == s.entry_count()
        assert report["records"] == len(s.records())

    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\x00garbage{not json")
    damaged_bytes = path.read_bytes()
    res = cli("fsck", str(path), "--json")
    assert res.code == 1
    bad = res.json()
    assert bad["ok"] is False
    assert bad["damage"] and all("offset" in d or "line" in d for d in bad["damage"])
    assert [d["offset"] for d in bad["damage"]] == [size]
    assert bad["entries"] == report["entries"]
    assert path.read_bytes() == damaged_bytes, "fsck must not modify the file"

    # the same through a real process: exit status 1, the offset on stdout
    child = sh("fsck", str(path))
    assert child.code == 1
    assert "DAMAGED" in child.out and f"offset {size}" in child.out


def test_fsck_missing_file(cli: Cli, tmp_path: Path) -> None:
    res = cli("fsck", str(tmp_path / "nope.jsonl"), "--json")
    assert res.code == 2  # nothing to check is an error, not damage
    assert res.json()["error"]["code"] == "session_not_found"


# -- crash points ------------------------------------------------------------------------------


def test_crash_points_lists_the_brief(cli: Cli) -> None:
    text = cli("crash-points")
    assert text.code == 0
    listed = {line.split()[0] for line in text.out.splitlines() if line.strip()}
    missing = set(BRIEF_CRASH_POINTS) - listed
    assert not missing, f"crash points of the brief not listed: {sorted(missing)}"
    data = cli("crash-points", "--json").json()
    assert set(BRIEF_CRASH_POINTS) <= set(data)
    assert data == CRASH_POINTS
    assert all(isinstance(v, str) and v for v in data.values())


# -- stores and session references ---------------------------------------------------------------


def test_sqlite_store(cli: Cli, script: Path, project: Path, tmp_path: Path, home: Path) -> None:
    db = tmp_path / "store.db"
    spec = f"sqlite:{db}"
    sid, _ = run_session(cli, script, project, store=spec)
    assert db.is_file()
    assert not (home / "sessions").exists(), "the default JSONL store was used"
    assert cli("sessions", "--json").json() == []
    store = open_store(spec)
    assert [i.id for i in store.list_sessions()] == [sid]
    with store.open_session(sid, write=False) as s:
        finished = [r["outcome"] for r in s.records() if r["type"] == "run_finished"]
        assert s.entry_count() == len(SCRIPT["turns"]) + 4
    assert finished == ["completed"]
    ctx = cli("context", sid, "--json", "--store", spec).json()
    assert_well_formed(ctx)
    assert ctx[-1]["content"][0]["text"] == SCRIPT["turns"][-1]["text"]
    assert cli("fsck", str(db), "--json").json()["ok"] is True


def test_session_prefix(cli: Cli, project: Path) -> None:
    store = open_store()
    for sid in ("aaaa-1", "aaaa-2", "bbbb-1"):
        store.create_session(str(project), session_id=sid).close()

    unique = cli("show", "bbbb", "--json")
    assert unique.code == 0 and unique.json()["session_id"] == "bbbb-1"
    exact = cli("show", "aaaa-2", "--json")
    assert exact.code == 0 and exact.json()["session_id"] == "aaaa-2"

    ambiguous = cli("show", "aaaa")
    assert ambiguous.code == 2
    assert "error[ambiguous_session_prefix]" in ambiguous.err
    assert "aaaa-1" in ambiguous.err and "aaaa-2" in ambiguous.err
    as_json = cli("context", "aaaa", "--json")
    assert as_json.code == 2
    err = as_json.json()["error"]
    assert err["code"] == "ambiguous_session_prefix"
    assert err["candidates"] == ["aaaa-1", "aaaa-2"]


def test_unknown_session(cli: Cli) -> None:
    for command in ("show", "context", "log", "cost", "recover"):
        res = cli(command, "no-such-session")
        assert res.code == 2, command
        assert res.err.startswith("error[session_not_found]"), (command, res.err)
        assert "no-such-session" in res.err
    as_json = cli("show", "no-such-session", "--json")
    assert as_json.code == 2
    assert as_json.json()["error"]["code"] == "session_not_found"


@pytest.mark.parametrize("spec", ["bogus", "nosuch:thing", "scripted:/no/such/script.json"])
def test_bad_provider_spec(cli: Cli, project: Path, spec: str) -> None:
    res = cli("run", "hi", "--provider", spec, "--cwd", str(project))
    assert res.code == 2
    assert res.err.startswith("error[format_error]"), res.err
    assert open_store().list_sessions() == [], "a session was created for a refused run"


def test_run_without_provider(cli: Cli, project: Path) -> None:
    res = cli("run", "hi", "--cwd", str(project))
    assert res.code == 2 and "error[format_error]" in res.err


def test_bad_store_spec(cli: Cli) -> None:
    res = cli("sessions", "--store", "nosql:/tmp/x", "--json")
    assert res.code == 2
    assert res.json()["error"]["code"] == "format_error"


def test_argparse_errors_exit_2(cli: Cli) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("no-such-command")
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli("show")
    assert exc.value.code == 2


# -- real processes ------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_in_a_subprocess(sh: Cli, script: Path, project: Path) -> None:
    res = sh("run", PROMPT, "--provider", f"scripted:{script}", "--cwd", str(project))
    assert res.code == 0, res.err
    assert SCRIPT["turns"][0]["text"] in res.out
    [info] = open_store().list_sessions()
    assert info.cwd == str(project)
    with open_store().open_session(info.id, write=False) as s:
        assert [r["outcome"] for r in s.records() if r["type"] == "run_finished"] == ["completed"]
    assert (project / "effect.log").read_text() == "ran\n"
    listed = sh("sessions", "--json")
    assert listed.code == 0 and [i["id"] for i in json.loads(listed.out)] == [info.id]


@pytest.mark.slow
def test_second_writer_is_refused(sh: Cli, script: Path, project: Path) -> None:
    store = open_store()
    store.create_session(str(project), session_id="held-1").close()
    holder = store.open_session("held-1", write=True)
    try:
        before = holder.entry_count()
        res = sh("run", "hi", "--provider", f"scripted:{script}", "--session", "held-1")
        assert res.code == 2, (res.out, res.err)
        assert "error[lease_held]" in res.err
        assert holder.entry_count() == before
        as_json = sh("resume", "held-1", "--json")
        assert as_json.code == 2
        assert json.loads(as_json.out)["error"]["code"] == "lease_held"
    finally:
        holder.close()
    with open_store().open_session("held-1", write=False) as s:
        assert s.entry_count() == 0 and s.records() == []
    # once the holder is gone, the same command is accepted
    res = sh("run", "hi", "--provider", f"scripted:{script}", "--session", "held-1", "--quiet")
    assert res.code == 0, res.err


@pytest.mark.crash
def test_run_on_a_suspended_lane_is_refused(
    cli: Cli, sh: Cli, script: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a real SIGKILL once both tool intents of turn 1 are durable: the lane is left suspended
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_tool_started:2")
    crashed = sh("run", PROMPT, "--provider", f"scripted:{script}", "--cwd", str(project))
    assert crashed.code == -9, crashed.err
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    [info] = open_store().list_sessions()
    with open_store().open_session(info.id, write=False) as s:
        count = s.entry_count()
        seq = s.last_seq()

    # the library's error arrives as error[lane_suspended], not as an exception-group traceback
    res = cli("run", "again", "--provider", f"scripted:{script}", "--session", info.id)
    assert res.code == 2, res.err
    assert "error[lane_suspended]" in res.err and "Traceback" not in res.err
    with open_store().open_session(info.id, write=False) as s:
        assert (s.entry_count(), s.last_seq()) == (count, seq)
    plan = cli("recover", info.id, "--json").json()
    [lane] = plan["lanes"]
    assert lane["state"] == "suspended"
    assert {c["tool_name"]: c["status"] for c in lane["tool_calls"]} == {
        "read_file": "in_doubt",
        "bash": "in_doubt",
    }
    assert not (project / "effect.log").exists()


def test_run_on_a_pi_file_is_refused(cli: Cli, script: Path, pi_sessions: Path) -> None:
    path = pi_sessions / "v3-branched.jsonl"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    res = cli("run", "hi", "--provider", f"scripted:{script}", "--session", str(path))
    assert res.code == 2
    assert "error[read_only]" in res.err and "Traceback" not in res.err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert open_store().list_sessions() == []


def test_run_continue_picks_the_most_recent_session_of_the_cwd(
    cli: Cli, script: Path, project: Path, tmp_path: Path
) -> None:
    sid, _ = run_session(cli, script, project)
    other = tmp_path / "other"
    other.mkdir()
    res = cli("run", "hi", "--provider", f"scripted:{script}", "--cwd", str(other), "--quiet")
    assert res.code == 0, res.err
    res = cli(
        "run", "Once more", "--provider", f"scripted:{script}", "--cwd", str(project), "--continue"
    )
    assert res.code == 0, res.err
    assert len(open_store().list_sessions()) == 2
    prompts = [
        e["message"]["content"][0]["text"]
        for e in messages(open_store(), sid)
        if e["message"]["role"] == "user"
    ]
    assert prompts == [PROMPT, "Once more"]


@pytest.mark.slow
def test_output_into_a_closed_pipe_is_quiet(home: Path) -> None:
    """``durable-harness crash-points | head -0``: the reader is gone before the first write;
    the command stops with status 141 and no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_harness", "crash-points"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
