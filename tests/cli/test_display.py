"""What the operator reads is what will run (issue 20): the CLI's human output shows bidi
controls, zero-width and other invisible characters of a session's text as ``\\u{HEX}``;
``--json`` prints the stored string exactly."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.storage import open_store

from .conftest import Result

Cli = Callable[..., Result]

# a command that reads "echo safe" in a bidi-aware view, and runs something else
COMMAND = "echo \u202e; rm -rf ./x\u200b #"
SHOWN = "echo \\u{202e}; rm -rf ./x\\u{200b} #"
CALL_ID = "call\u202e_1"
CALL_SHOWN = "call\\u{202e}_1"


@pytest.fixture
def in_doubt(sh: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A session whose one bash call (``COMMAND``) is left in doubt by a real SIGKILL after
    its intent is durable; its working directory's name holds a U+2066. Returns its id and
    the directory."""
    project = tmp_path / "proj\u2066ect"
    project.mkdir()
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {
                        "text": "Cleaning up\u202e now.",
                        "tool_calls": [
                            {"id": CALL_ID, "name": "bash", "arguments": {"command": COMMAND}}
                        ],
                    },
                    {"text": "done"},
                ]
            }
        )
    )
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_tool_started")
    crashed = sh("run", "clean up", "--provider", f"scripted:{script}", "--cwd", str(project))
    assert crashed.code == -9, crashed.err
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    [info] = open_store().list_sessions()
    return info.id, project


def _no_raw(text: str) -> None:
    assert "\u202e" not in text and "\u200b" not in text and "\u2066" not in text


@pytest.mark.crash
def test_recover_shows_the_escaped_command_and_json_the_stored_one(
    cli: Cli, in_doubt: tuple[str, Path]
) -> None:
    sid, _ = in_doubt
    res = cli("recover", sid)
    assert res.code == 0, res.err
    _no_raw(res.out)
    assert SHOWN in res.out  # the "with arguments" line of the waiting call
    assert f"--decide {CALL_SHOWN}=retry" in res.out
    plan = cli("recover", sid, "--json").json()
    [call] = plan["lanes"][0]["tool_calls"]
    assert call["arguments"] == {"command": COMMAND}
    assert call["tool_call_id"] == CALL_ID
    # the stored records are untouched by the display
    with open_store().open_session(sid, write=False) as s:
        [started] = s.records(None, types=("tool_started",))
        assert started["toolCallId"] == CALL_ID


@pytest.mark.crash
def test_show_log_context_and_sessions_escape(cli: Cli, in_doubt: tuple[str, Path]) -> None:
    sid, project = in_doubt
    shown_cwd = str(project).replace("\u2066", "\\u{2066}")
    res = cli("show", sid, "--tree")
    assert res.code == 0, res.err
    _no_raw(res.out)
    assert f"cwd {shown_cwd}" in res.out
    assert "Cleaning up\\u{202e} now." in res.out and CALL_SHOWN not in res.out
    assert cli("show", sid, "--json").json()["cwd"] == str(project)

    res = cli("log", sid)
    assert res.code == 0, res.err
    _no_raw(res.out)
    assert f"bash {CALL_SHOWN} replay=" in res.out
    rows = cli("log", sid, "--json").json()
    assert any(r["summary"].startswith(f"bash {CALL_ID} ") for r in rows)

    res = cli("context", sid)
    assert res.code == 0, res.err
    _no_raw(res.out)
    assert SHOWN in res.out and CALL_SHOWN in res.out
    assert "\n" in res.out.strip()  # multi-line text keeps its lines

    res = cli("sessions")
    assert res.code == 0, res.err
    _no_raw(res.out)
    assert shown_cwd in res.out
    assert [s["cwd"] for s in cli("sessions", "--json").json()] == [str(project)]
