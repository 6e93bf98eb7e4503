"""The tree verbs (``label``, ``name``, ``navigate``, ``branch-summary``), removal (``forget``,
``prune``), ``resume --latest`` and the listed title, checked through what the store holds
afterwards (issue 24, "The command line")."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.session import Session
from durable_harness.storage import open_store

from .conftest import Result

Cli = Callable[..., Result]

TWO_ANSWERS = {"turns": [{"text": "first answer"}]}


def _one_run(cli: Cli, where: Path, prompt: str = "say hello\nand more") -> tuple[str, Path]:
    """Run ``prompt`` in a new session of ``where``; its id and the script file."""
    where.mkdir(exist_ok=True)
    script = where / "two.json"
    script.write_text(json.dumps(TWO_ANSWERS))
    before = {i.id for i in open_store().list_sessions()}
    res = cli("run", prompt, "--provider", f"scripted:{script}", "--cwd", str(where))
    assert res.code == 0, res.err
    [sid] = {i.id for i in open_store().list_sessions()} - before
    return sid, script


def _entries(sid: str) -> list[dict[str, object]]:
    with open_store().open_session(sid, write=False) as s:
        return s.iter_entries()


def test_name_and_label_are_entries_and_the_listing_shows_the_title(
    cli: Cli, tmp_path: Path
) -> None:
    sid, _ = _one_run(cli, tmp_path)
    listed = cli("sessions")
    header, row = listed.out.splitlines()
    assert header.split() == ["ID", "MODIFIED", "STATE", "WAITING", "CWD", "TITLE"]
    assert row.endswith("say hello")  # the first line of the first prompt
    assert cli("sessions", "--json").json()[0]["title"] == "say hello"

    assert cli("name", sid[:8], "nightly bumps").code == 0
    user = next(e for e in _entries(sid) if e["type"] == "message")
    res = cli("label", sid, str(user["id"]), "the ask", "--json")
    assert res.code == 0 and res.json()["targetId"] == user["id"]
    with Session(open_store().open_session(sid, write=False)) as s:
        assert s.name == "nightly bumps" and s.title == "nightly bumps"
        assert s.labels() == {user["id"]: "the ask"}
    assert cli("sessions").out.splitlines()[1].endswith("nightly bumps")
    shown = cli("show", sid, "--json").json()
    assert (shown["name"], shown["title"]) == ("nightly bumps", "nightly bumps")

    assert cli("label", sid, str(user["id"])).code == 0  # no text: cleared
    with Session(open_store().open_session(sid, write=False)) as s:
        assert s.labels() == {}
    missing = cli("label", sid, "feedface00000000", "x")
    assert missing.code == 2 and "error[unknown_entry]" in missing.err


def test_navigate_moves_the_leaf_durably_and_the_next_run_continues_there(
    cli: Cli, tmp_path: Path
) -> None:
    sid, _ = _one_run(cli, tmp_path)
    user = next(e for e in _entries(sid) if e["type"] == "message")
    res = cli("navigate", sid, str(user["id"]), "--json")
    assert res.code == 0, res.err
    assert res.json()["leaf"] == user["id"]
    with open_store().open_session(sid, write=False) as s:
        assert s.lane("main").leaf_id == user["id"]
    unknown = cli("navigate", sid, "feedface00000000")
    assert unknown.code == 2 and "error[unknown_entry]" in unknown.err
    no_lane = cli("navigate", sid, str(user["id"]), "--lane", "side")
    assert no_lane.code == 2 and "error[unknown_lane]" in no_lane.err


def test_branch_summary_summarises_the_branch_left_with_the_recorded_provider(
    cli: Cli, tmp_path: Path
) -> None:
    sid, _ = _one_run(cli, tmp_path)
    before = _entries(sid)
    user = next(e for e in before if e["type"] == "message")
    res = cli("branch-summary", sid, str(user["id"]), "--json")
    assert res.code == 0, res.err
    summary = res.json()
    assert summary["type"] == "branch_summary" and summary["parentId"] == user["id"]
    # the scripted model answers a summary request with a digest of what it was sent
    assert summary["summary"].startswith("Summary of 3 messages: say hello")
    assert summary["fromId"] == before[-1]["id"]  # the leaf it left
    with open_store().open_session(sid, write=False) as s:
        assert s.lane("main").leaf_id == summary["id"]
        # the summary was a provider request under the intent rules: intent, then settlement
        kinds = [r["type"] for r in s.records()]
    assert kinds.count("provider_request_started") == 2
    assert kinds.count("provider_request_finished") == 2


@pytest.mark.crash
def test_forget_and_prune_keep_suspended_and_live_sessions(
    cli: Cli, sh: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a real SIGKILL with a bash call in doubt: that session is suspended (waits for a decision)
    crash_script = tmp_path / "crash.json"
    crash_script.write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "text": "",
                        "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}],
                    },
                    {"text": "done"},
                ]
            }
        )
    )
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_tool_started")
    crashed = sh("run", "deploy", "--provider", f"scripted:{crash_script}", "--cwd", str(tmp_path))
    assert crashed.code == -9, crashed.err
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    [suspended] = open_store().list_sessions()
    # the crashed lane cannot be moved: its recovery resumes from the recorded leaf
    leaf_entry = _entries(suspended.id)[0]
    moved = cli("navigate", suspended.id, str(leaf_entry["id"]))
    assert moved.code == 2 and "error[lane_suspended]" in moved.err

    closed_id, _ = _one_run(cli, tmp_path / "b")
    held_id, _ = _one_run(cli, tmp_path / "c")
    old = time.time() - 3 * 86400
    for info in open_store().list_sessions():
        os.utime(info.path, (old, old))  # JSONL: the file's mtime is the catalogue's modified

    refused = cli("forget", suspended.id)
    assert refused.code == 2 and "error[illegal_transition]" in refused.err
    with open_store().open_session(held_id, write=True):  # a live writer holds it
        live = cli("forget", held_id)
        assert live.code == 2 and "error[session_live]" in live.err
        dry = cli("prune", "--closed", "--older-than", "2d", "--dry-run", "--json").json()
        assert dry["forgotten"] == [closed_id] and dry["dry_run"] is True
        assert [k["session_id"] for k in dry["kept"]] == [held_id]
        assert dry["skipped"] == {"newer": 0, "not_closed": 1, "unreadable": 0}
        assert len(open_store().list_sessions()) == 3  # the dry run deleted nothing
        young = cli("prune", "--closed", "--older-than", "4d", "--json").json()
        assert young["forgotten"] == [] and young["skipped"]["newer"] == 3
        pruned = cli("prune", "--closed", "--older-than", "2d")
        assert pruned.code == 0, pruned.err
        assert f"forgot session {closed_id}" in pruned.out
        assert "forgot 1 session(s); kept 1 held by a process; skipped 0 newer" in pruned.out
    left = {i.id for i in open_store().list_sessions()}
    assert left == {suspended.id, held_id}
    assert cli("forget", held_id).code == 0
    assert {i.id for i in open_store().list_sessions()} == {suspended.id}


def test_resume_latest_takes_the_directory_s_most_recent_session(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    none = cli("resume", "--latest")
    assert none.code == 2 and "error[session_not_found]" in none.err
    sid, _ = _one_run(cli, tmp_path)
    res = cli("resume", "--latest", "--json")
    assert res.code == 0, res.err
    assert res.json()["results"] == {"main": "idle"}
    both = cli("resume", sid, "--latest")
    assert both.code == 2 and "one of SESSION, --latest or -r" in both.err
    assert cli("resume").code == 2


def test_prune_refuses_a_duration_it_cannot_read(cli: Cli) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("prune", "--closed", "--older-than", "3 fortnights")
    assert exc.value.code == 2


def test_an_entry_is_named_by_a_unique_prefix_as_the_help_examples_show(
    cli: Cli, tmp_path: Path
) -> None:
    sid, _ = _one_run(cli, tmp_path)
    user = next(e for e in _entries(sid) if e["type"] == "message")
    res = cli("label", sid, str(user["id"])[:8], "short", "--json")
    assert res.code == 0 and res.json()["targetId"] == user["id"]
    res = cli("navigate", sid, str(user["id"])[:8], "--json")
    assert res.code == 0 and res.json()["leaf"] == user["id"]
    assert cli("label", sid, "", "every entry matches").code == 2  # ambiguous, refused
