"""MCP calls through the command line, in real child processes: ``run --mcp`` SIGKILLed at the
crash points of an MCP call (``DURABLE_HARNESS_CRASH_AT``), then ``recover --mcp`` and
``resume --mcp``: a read-only call re-runs, a destructive one waits for a decision and its
effect happens once; a server gone at resume is an error result, not a crash."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from durable_harness import open_store
from durable_harness.cli.main import main as cli_main
from durable_harness.crashtest import forkserver

from .conftest import stdio_server

pytestmark = [pytest.mark.crash, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]


def child_env(home: Path, crash_at: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS_")}
    env["DURABLE_HARNESS_HOME"] = str(home)
    env["DURABLE_HARNESS_STORE"] = f"sqlite:{home / 'store.db'}"
    env["DURABLE_HARNESS_CHECK_ALL_RECORDS"] = "1"
    if crash_at:
        env["DURABLE_HARNESS_CRASH_AT"] = crash_at
    return env


def dh(home: Path, *args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``durable-harness ARGS`` in a child process: forked from the warm fork server with the
    CLI imported (a process of its own that the crash point SIGKILLs, its MCP servers its own
    children), not a fresh interpreter per run and resume (issue 22)."""
    env = child_env(home, crash_at)
    return forkserver.run_cli(list(args), env=env, cwd=str(REPO), timeout=90)


def read(
    home: Path, *args: str, monkeypatch: pytest.MonkeyPatch
) -> subprocess.CompletedProcess[str]:
    """A read (``recover --json``, ``context``, ``--help``) through the CLI's ``main(argv)`` in
    this process, with the children's environment: it changes nothing and takes no lease."""
    out, err = io.StringIO(), io.StringIO()
    with monkeypatch.context() as m:
        for k in [k for k in os.environ if k.startswith("DURABLE_HARNESS_")]:
            m.delenv(k)
        for k, v in child_env(home).items():
            m.setenv(k, v)
        m.chdir(REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_main(list(args))
            except SystemExit as exc:  # argparse's --help
                code = exc.code if isinstance(exc.code, int) else 0
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def scripted(tmp_path: Path, tool: str, arguments: dict[str, Any]) -> Path:
    script = tmp_path / "script.json"
    turn = {"text": "calling", "tool_calls": [{"name": tool, "arguments": arguments}]}
    script.write_text(json.dumps({"turns": [turn, {"text": "Done."}]}))
    return script


def crashed_run(tmp_path: Path, config: Path, tool: str, args: dict[str, Any], at: str) -> str:
    """Run one MCP call SIGKILLed at ``at``; the session id."""
    script = scripted(tmp_path, tool, args)
    home = tmp_path / "home"
    run = dh(
        home,
        "run",
        "go",
        "--provider",
        f"scripted:{script}",
        "--mcp",
        str(config),
        "--cwd",
        str(tmp_path),
        crash_at=at,
    )
    assert run.returncode == -9, run.stderr
    return run.stderr.split("session ", 1)[1].split()[0]


def tool_records(home: Path, session: str) -> list[dict[str, Any]]:
    """The session's tool records, read from its store (a fresh read-only open)."""
    with open_store(f"sqlite:{home / 'store.db'}").open_session(session, write=False) as s:
        return list(s.records(types=("tool_started", "tool_finished")))


def plan_call(
    home: Path, session: str, config: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    rec = read(home, "recover", session, "--json", "--mcp", str(config), monkeypatch=monkeypatch)
    assert rec.returncode == 0, rec.stderr
    (lane,) = json.loads(rec.stdout)["lanes"]
    (call,) = lane["tool_calls"]
    return dict(call)


def test_a_read_only_call_in_doubt_re_runs(
    tmp_path: Path, notes: Path, write_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config({"notes": stdio_server(notes)})
    notes.write_text("kept\n")
    sid = crashed_run(tmp_path, config, "mcp__notes__peek", {}, "after_tool_started")
    home = tmp_path / "home"
    started = [r for r in tool_records(home, sid) if r["type"] == "tool_started"]
    assert started[0]["mcp"]["serverInfo"] == {"name": "notes", "version": "1.2.3"}
    assert started[0]["mcp"]["annotations"] == {"readOnlyHint": True}
    assert started[0]["replay"] == "safe" and started[0]["arguments"] == {}
    call = plan_call(home, sid, config, monkeypatch)
    assert (call["status"], call["action"]) == ("in_doubt", "re-execute")
    resumed = dh(home, "resume", sid, "--mcp", str(config))
    assert resumed.returncode == 0, resumed.stderr
    ctx = json.loads(read(home, "context", sid, "--json", monkeypatch=monkeypatch).stdout)
    (result,) = [m for m in ctx if m["role"] == "toolResult"]
    assert result["content"] == [{"type": "text", "text": "kept\n"}] and not result["isError"]
    attempts = [r["attempt"] for r in tool_records(home, sid) if r["type"] == "tool_started"]
    assert attempts == [1, 2]


def test_a_destructive_call_in_doubt_waits_and_lands_once(
    tmp_path: Path, notes: Path, write_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config({"notes": stdio_server(notes)})
    sid = crashed_run(
        tmp_path, config, "mcp__notes__append_line", {"line": "x"}, "after_tool_effect"
    )
    home = tmp_path / "home"
    assert notes.read_text() == "x\n"  # the effect happened; its result was never written
    call = plan_call(home, sid, config, monkeypatch)
    assert (call["status"], call["replay"], call["action"]) == (
        "in_doubt",
        "never",
        "await_decision",
    )
    done = dh(
        home,
        "resume",
        sid,
        "--mcp",
        str(config),
        "--decide",
        f"{call['tool_call_id']}=result:appended x (checked)",
    )
    assert done.returncode == 0, done.stderr
    assert notes.read_text() == "x\n"  # one effect


def test_a_server_gone_at_resume_is_an_error_result(
    tmp_path: Path, notes: Path, write_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config({"notes": stdio_server(notes)})
    sid = crashed_run(tmp_path, config, "mcp__notes__peek", {}, "after_tool_started")
    home = tmp_path / "home"
    gone = write_config({"notes": {"command": str(tmp_path / "uninstalled-server")}})
    resumed = dh(home, "resume", sid, "--mcp", str(gone))
    assert resumed.returncode == 0, resumed.stderr  # the run went on to its end
    assert "MCP server notes unavailable" in resumed.stderr
    ctx = json.loads(read(home, "context", sid, "--json", monkeypatch=monkeypatch).stdout)
    (result,) = [m for m in ctx if m["role"] == "toolResult"]
    assert result["isError"]
    assert "MCP server notes is unavailable" in result["content"][0]["text"]
    assert ctx[-1]["role"] == "assistant"


def test_run_with_a_bad_config_exits_2_naming_it(tmp_path: Path, write_config: Any) -> None:
    config = write_config({"notes": {"url": "nope"}})
    script = scripted(tmp_path, "mcp__notes__peek", {})
    run = dh(
        tmp_path / "home", "run", "go", "--provider", f"scripted:{script}", "--mcp", str(config)
    )
    assert run.returncode == 2
    assert "error[mcp_config_error]" in run.stderr and str(config) in run.stderr


@pytest.mark.parametrize("front", ["serve", "acp"])
def test_the_host_fronts_take_mcp(front: str, monkeypatch: pytest.MonkeyPatch) -> None:
    helped = read(Path("/nonexistent"), front, "--help", monkeypatch=monkeypatch)
    assert "--mcp CONFIG" in helped.stdout
