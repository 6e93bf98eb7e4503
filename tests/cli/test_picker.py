"""``resume -r``: the picker under a real pseudo-terminal, and refused off one (issue 24)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_harness.storage import open_store

from .conftest import Result

Cli = Callable[..., Result]

BASH_TURN = {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}


def _read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    """What the terminal showed until ``needle`` appeared (or the child closed it)."""
    seen = b""
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {needle!r}; the terminal showed {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.crash
def test_the_picker_lists_waiting_sessions_first_and_resumes_the_one_picked(
    cli: Cli, sh: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    quiet = tmp_path / "quiet.json"
    quiet.write_text(json.dumps({"turns": [{"text": "ok"}]}))
    assert (
        cli("run", "tidy the docs", "--provider", f"scripted:{quiet}", "--cwd", str(work)).code == 0
    )
    deploy = tmp_path / "deploy.json"
    deploy.write_text(json.dumps({"turns": [BASH_TURN, {"text": "done"}]}))
    monkeypatch.setenv("DURABLE_HARNESS_CRASH_AT", "after_tool_started")
    crashed = sh("run", "deploy it", "--provider", f"scripted:{deploy}", "--cwd", str(work))
    assert crashed.code == -9, crashed.err
    monkeypatch.delenv("DURABLE_HARNESS_CRASH_AT")
    assert cli("run", "newest one", "--provider", f"scripted:{quiet}", "--cwd", str(work)).code == 0
    suspended = crashed.err.split("session ", 1)[1].split()[0]  # `run` names it on stderr
    assert len(open_store().list_sessions()) == 3
    master, slave = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "durable_harness", "resume", "-r"],
        stdin=slave, stdout=slave, stderr=slave, cwd=work, env=dict(os.environ),
    )  # fmt: skip
    os.close(slave)
    try:
        shown = _read_until(master, b"resume which session? [1-3]", time.monotonic() + 60)
        listing = [ln for ln in shown.decode().splitlines() if ") " in ln]
        assert len(listing) == 3, shown
        # the session waiting for a decision comes first, then the others newest first
        assert "suspended, 1 waiting" in listing[0] and "deploy it" in listing[0]
        assert "newest one" in listing[1] and "tidy the docs" in listing[2]
        os.write(master, b"1\n")
        rest = _read_until(master, b"lane main: suspended", time.monotonic() + 60)
        assert f"resuming session {suspended}".encode() in rest
        assert child.wait(timeout=60) == 5  # still waiting: the bash call is in doubt
    finally:
        if child.poll() is None:
            child.kill()
        os.close(master)


def test_the_picker_needs_a_terminal(cli: Cli) -> None:
    res = cli("resume", "-r")
    assert res.code == 2 and "error[format_error]" in res.err and "terminal" in res.err
