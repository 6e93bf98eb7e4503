"""Running one benchmark's ``--quick`` variant from a smoke test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_quick(name: str, tmp_path: Path, timeout: float) -> dict[str, Any]:
    """Run ``python -m bench NAME --quick`` with its scratch and results under ``tmp_path``;
    assert it exited 0 and return its results file (``NAME.json``) parsed."""
    env = {
        **os.environ,
        "DH_BENCH_TMP": str(tmp_path / "scratch"),
        "DH_BENCH_RESULTS": str(tmp_path / "results"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bench", name, "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data: dict[str, Any] = json.loads((tmp_path / "results" / f"{name}.json").read_text())
    return data
