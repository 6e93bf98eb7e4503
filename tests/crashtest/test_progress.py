"""``crash-test`` writes a plain progress line when stdout is not a terminal (issue 22: at
least every 10 s; the interval is an environment setting, so nothing here depends on time)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from durable_harness.terminal import PROGRESS_EVERY_ENV

from .conftest import DH

pytestmark = pytest.mark.crash
LINE = re.compile(r"^crash-test: (\d+)/(\d+) cells, (\d+) failed, \d+ s$", re.M)
START = "crash-test: running the crash-free baselines, "


def test_plain_progress_lines_when_stdout_is_a_pipe() -> None:
    env = os.environ | {PROGRESS_EVERY_ENV: "0.05"}
    points = ["--point", "after_run_started", "--point", "after_tool_started"]
    proc = subprocess.run(
        [*DH, "crash-test", "--scenario", "single_tool", "--backend", "jsonl", *points],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = LINE.findall(proc.stdout)
    assert lines, proc.stdout
    assert proc.stdout.startswith(START), proc.stdout  # at the start, before the total is known
    assert lines[-1] == ("2", "2", "0")  # at the end: every cell, none failed
    done = [int(d) for d, _, _ in lines]
    assert done == sorted(done)  # counts only go up
    assert "\x1b" not in proc.stdout
