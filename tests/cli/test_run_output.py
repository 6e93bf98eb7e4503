"""``run --json`` (one object at the end, nothing streamed) and ``resume`` streaming the resumed
run as ``run`` does (issue 24, "The command line")."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.storage import open_store

from .conftest import Result

Cli = Callable[..., Result]


def test_run_json_prints_one_object_with_the_outcome_and_the_answer(
    cli: Cli, script: Path, project: Path
) -> None:
    res = cli("run", "go", "--provider", f"scripted:{script}", "--cwd", str(project), "--json")
    assert res.code == 0, res.err
    got = json.loads(res.out)  # the whole of stdout is the one object: nothing streamed
    [info] = open_store().list_sessions()
    assert got["session_id"] == info.id and got["lane"] == "main"
    assert got["outcome"] == "completed" and got["awaiting"] == []
    assert got["text"] == "All done: summary.md is written."
    with open_store().open_session(info.id, write=False) as s:
        [started] = s.records("main", types=("run_started",))
    assert got["run_id"] == started["runId"]
    assert "--- turn" not in res.out and "session " not in res.err


@pytest.mark.crash
def test_resume_streams_the_resumed_run_as_run_does(
    cli: Cli, sh: Cli, tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "safe.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "text": "Reading.",
                        "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
                    },
                    {"text": "The notes say to buy milk."},
                ]
            }
        )
    )
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_tool_started")
    crashed = sh("run", "go", "--provider", f"scripted:{script}", "--cwd", str(project))
    assert crashed.code == -9, crashed.err
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    res = cli("resume", open_store().list_sessions()[0].id)
    assert res.code == 0, res.err
    # the replay-safe read re-runs, then the next turn's answer streams as `run` prints it
    assert "[tool] read_file" in res.out
    assert "--- turn" in res.out and "The notes say to buy milk." in res.out
    assert res.out.rstrip().endswith("lane main: completed")
