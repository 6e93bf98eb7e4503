"""The full crash matrix, run once per suite and shared by every test that reads its report.

``make test`` runs pytest with ``-n 2 --dist loadfile``: every test taking ``full_matrix`` is in
``test_matrix.py``, so one worker runs the matrix while the other runs the rest of the suite
(``tests/conftest.py`` hands that file out first: the suite's longest step).
(``--dist loadgroup`` would be the finer tool, but pytest-xdist 3.8 cannot tag node ids under
pytest 9.2, so its groups silently fall apart.) Should such tests land on two workers anyway
(another ``--dist`` mode), a lock file in the run's shared temporary folder makes the second
worker wait for the first one's report instead of running the 350 cells again.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_harness.terminal import PROGRESS_EVERY_ENV

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]

# Generous on purpose: about 3 minutes on a quiet 2-core machine, several times that beside a
# second copy of the suite. The limit is there so a hung child fails the run, not to time it.
MATRIX_TIMEOUT = 3600
# The matrix's plain progress lines (stdout is a pipe here) every second rather than every 10:
# test_matrix.py's progress test reads them from this one run instead of crash-testing cells of
# its own (issue 22: no test repeats the matrix's cells).
PROGRESS_EVERY_S = "1"


@dataclass(frozen=True)
class MatrixRun:
    """One ``durable-harness crash-test --report FILE.json`` run over every scenario and both
    backends: its exit code, output, and the parsed report (``None`` when none was written)."""

    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None

    def why(self) -> str:
        """The end of the run's output, for an assertion message."""
        return self.stdout[-4000:] + self.stderr[-2000:]


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's basetemp is a child of the run's own folder; a plain run's
    # basetemp is already private to it (the parent is shared by every pytest run of the user)
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _run(folder: Path) -> MatrixRun:
    report = folder / "crash-matrix.json"
    proc = subprocess.run(
        [*DH, "crash-test", "--report", str(report)],
        capture_output=True,
        text=True,
        env=os.environ | {PROGRESS_EVERY_ENV: PROGRESS_EVERY_S},
        check=False,
    )
    data = json.loads(report.read_text()) if report.exists() else None
    return MatrixRun(proc.returncode, proc.stdout, proc.stderr, data)


@pytest.fixture(scope="session")
def full_matrix(tmp_path_factory: pytest.TempPathFactory) -> MatrixRun:
    """The full matrix through the console script, run at most once per pytest run."""
    folder = _shared_dir(tmp_path_factory)
    saved = folder / "crash-matrix-run.json"
    with open(folder / "crash-matrix.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not saved.exists():
            run = _run(folder)
            saved.write_text(json.dumps(vars(run)))
            return run
    return MatrixRun(**json.loads(saved.read_text()))
