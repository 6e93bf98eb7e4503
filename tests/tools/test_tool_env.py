"""Tool processes do not inherit the harness's credentials (issue 10, "Files and credentials"):
variables that look like secrets are removed from bash's environment unless allowed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durable_harness.cli.main import main
from durable_harness.models.messages import text_of
from durable_harness.tools.base import ToolContext
from durable_harness.tools.builtin import BashTool, is_secret_name, tool_environment

SECRET = "sk-test-7f3a9c1e5b2d4f60aa"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("ANTHROPIC_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("GITHUB_TOKEN", True),
        ("github_token", True),
        ("CLIENT_SECRET", True),
        ("PGPASSWORD", True),
        ("DB_PASSWORD_FILE", True),
        ("PATH", False),
        ("HOME", False),
        ("KEYBOARD", False),
        ("TOKENIZERS_PARALLELISM", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_tool_environment_removes_secrets_and_honours_the_allow_list() -> None:
    base = {"PATH": "/bin", "OPENAI_API_KEY": "a", "GH_TOKEN": "b", "MY_PASSWORD": "c"}
    assert tool_environment(base) == {"PATH": "/bin"}
    assert tool_environment(base, ["GH_TOKEN"]) == {"PATH": "/bin", "GH_TOKEN": "b"}
    assert tool_environment(base, ["*_KEY", "MY_*"]) == {
        "PATH": "/bin",
        "OPENAI_API_KEY": "a",
        "MY_PASSWORD": "c",
    }


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(
        cwd=tmp_path,
        run_id="run-1",
        tool_call_id="call-1",
        idempotency_key="run-1:call-1",
        env={"EXPLICIT_TOKEN": "given-by-the-caller"},
    )


async def _env(tool: BashTool, ctx: ToolContext) -> str:
    result = await tool.execute(tool.parse_args({"command": "env"}), ctx)
    return text_of(result.content)


@pytest.mark.anyio
async def test_bash_does_not_inherit_provider_keys(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("SOME_SERVICE_TOKEN", SECRET + "2")
    monkeypatch.setenv("HARMLESS_SETTING", "visible")
    out = await _env(BashTool(), ctx)
    assert SECRET not in out
    assert "OPENAI_API_KEY" not in out and "SOME_SERVICE_TOKEN" not in out
    assert "HARMLESS_SETTING=visible" in out
    assert "EXPLICIT_TOKEN=given-by-the-caller" in out  # ctx.env is explicit: kept
    assert "DURABLE_HARNESS_IDEMPOTENCY_KEY=run-1:call-1" in out


@pytest.mark.anyio
async def test_bash_allow_env_lets_a_named_secret_through(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("GITHUB_TOKEN", "gh-value")
    out = await _env(BashTool(allow_env=["GITHUB_TOKEN"]), ctx)
    assert "GITHUB_TOKEN=gh-value" in out
    assert SECRET not in out


def _bash_env_script(path: Path) -> Path:
    script: dict[str, Any] = {
        "turns": [
            {
                "text": "Checking.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "env"}}],
            },
            {"text": "Done."},
        ]
    }
    path.write_text(json.dumps(script))
    return path


def test_run_bash_env_does_not_write_openai_key_into_session_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-to-end case of the issue: `env` inside a run's bash call, OPENAI_API_KEY set in
    the harness's environment; the session file must not hold the key's value. With
    ``--allow-env`` the user opts in and the value does reach the tool (and the file)."""
    home = tmp_path / "home"
    monkeypatch.setenv("DURABLE_HARNESS_HOME", str(home))
    monkeypatch.delenv("DURABLE_HARNESS_STORE", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    script = _bash_env_script(tmp_path / "script.json")
    project = tmp_path / "project"
    project.mkdir()
    args = ["run", "--provider", f"scripted:{script}", "--cwd", str(project), "--quiet", "go"]
    assert main(args) == 0
    files = list(home.rglob("*.jsonl"))
    assert len(files) == 1
    data = files[0].read_bytes()
    assert b"PATH=" in data  # the env output is in the file
    assert SECRET.encode() not in data

    assert main([*args[:-1], "--allow-env", "OPENAI_API_KEY", "go"]) == 0
    values = [p.read_bytes() for p in home.rglob("*.jsonl")]
    assert sum(SECRET.encode() in v for v in values) == 1
