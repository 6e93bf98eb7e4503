"""Fixtures for the CLI tests: an isolated ``$DURABLE_HARNESS_HOME``, in-process and subprocess
runners of ``durable-harness``, a scripted provider file, and the shared pi session files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_harness.cli.main import main
from durable_harness.crashtest import forkserver

PI_SESSIONS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pi-sessions"
REPO = Path(__file__).resolve().parents[2]

# Three turns: two independent tools (a replay-safe read and a shell effect), then a write, then
# the final answer. Tool calls of one turn may run concurrently, so they do not depend on each
# other. Costs are distinct per turn so the totals check means something.
SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "text": "Let me look at the notes first.",
            "chunks": 4,
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "notes.txt"}},
                {"name": "bash", "arguments": {"command": "echo ran >> effect.log"}},
            ],
            "usage": {"input": 100, "output": 20, "cost": {"input": 0.001, "output": 0.002}},
        },
        {
            "text": "Now I write the summary.",
            "tool_calls": [
                {
                    "name": "write_file",
                    "arguments": {"path": "summary.md", "content": "# Summary\n"},
                }
            ],
            "usage": {
                "input": 200,
                "output": 30,
                "cacheRead": 50,
                "cost": {"input": 0.002, "output": 0.003, "cacheRead": 0.0005},
            },
        },
        {
            "text": "All done: summary.md is written.",
            "usage": {"input": 300, "output": 10, "cost": {"input": 0.003, "output": 0.0004}},
        },
    ]
}
SCRIPT_TOTAL_COST = 0.001 + 0.002 + 0.002 + 0.003 + 0.0005 + 0.003 + 0.0004
SCRIPT_TOTAL_TOKENS = 120 + 230 + 310


@dataclass
class Result:
    """What one CLI invocation returned and printed."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """Parse stdout as JSON."""
        return json.loads(self.out)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own ``$DURABLE_HARNESS_HOME``; no inherited store or crash point."""
    path = tmp_path / "home"
    monkeypatch.setenv("DURABLE_HARNESS_HOME", str(path))
    for var in ("DURABLE_HARNESS_STORE", "DURABLE_HARNESS_CRASH_AT", "DURABLE_HARNESS_CRASH_TRACE"):
        monkeypatch.delenv(var, raising=False)
    return path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``durable-harness ARGS`` in this process through ``main(argv)``."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def sh(home: Path) -> Callable[..., Result]:
    """Run ``durable-harness ARGS`` in a child process (same environment), forked from the warm
    fork server (:func:`~durable_harness.crashtest.forkserver.run_cli`)."""

    def run(*args: str, cwd: Path | None = None, timeout: float = 60) -> Result:
        proc = forkserver.run_cli(
            list(args), env=dict(os.environ), cwd=str(cwd or REPO), timeout=timeout
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A working directory with one file for ``read_file`` to read."""
    path = tmp_path / "project"
    path.mkdir()
    (path / "notes.txt").write_text("remember the milk\n")
    return path


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """The scripted provider file (:data:`SCRIPT`)."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


@pytest.fixture
def pi_sessions() -> Path:
    """The shared folder of real pi session files, read in place (never copied or modified)."""
    if not PI_SESSIONS.is_dir():
        pytest.skip(f"shared pi session files not found at {PI_SESSIONS}: tests read them in place")
    return PI_SESSIONS
