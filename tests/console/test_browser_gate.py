"""Without Chromium the browser test skips with its reason, and under ``CI=true`` it fails
instead (a CI run must not pass without having driven a browser)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BROWSER_TEST = Path(__file__).with_name("test_browser.py")


def run_without_chromium(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {
        "CONSOLE_CHROMIUM": str(tmp_path / "no-chromium"),
        "CONSOLE_CHROMEDRIVER": str(tmp_path / "no-chromedriver"),
    }
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rsE",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(BROWSER_TEST),
            "--basetemp",
            str(tmp_path / "inner"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BROWSER_TEST.parents[2],
    )


@pytest.mark.slow
def test_the_browser_test_skips_without_chromium_and_errors_under_ci(tmp_path: Path) -> None:
    skipped = run_without_chromium(tmp_path, None)
    assert skipped.returncode == 0, skipped.stdout
    # every browser test of the file skips (none passes without a browser)
    assert re.search(r"\b\d+ skipped", skipped.stdout) and "passed" not in skipped.stdout
    assert "headless Chromium is not installed" in skipped.stdout
    failed = run_without_chromium(tmp_path, "true")
    assert failed.returncode != 0, failed.stdout
    assert "CI must run the browser test" in failed.stdout
    assert "skipped" not in failed.stdout.splitlines()[-1]
