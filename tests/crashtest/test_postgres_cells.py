"""Crash cells on the PostgreSQL backend (the whole matrix on it runs in ``make crash-test``):
a child SIGKILLed at the riskiest points of a one-tool run is recovered from the database, its
lease taken over at once (the dead holder was on this host), and every invariant holds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest.runner import PG_ENV

from .conftest import DH

# the last: after the commit holding the settlement, the save point and the next request
# (merged commits, design/crash-matrix.md; after_save_point is no longer a state of this run)
POINTS = ("after_tool_started", "after_tool_effect", "after_provider_request_started:2")


@pytest.mark.crash
@pytest.mark.timeout(600)
def test_crash_cells_pass_on_postgres(pg_cluster: Any, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    env = {**os.environ, PG_ENV: pg_cluster.spec}
    before = _schemas(pg_cluster)  # the cluster is the worker's: other tests' may be there
    proc = subprocess.run(
        [*DH, "crash-test", "--backend", "postgres", "--scenario", "single_tool", "--jobs", "1",
         *(a for p in POINTS for a in ("--point", p)), "--report", str(report)],
        capture_output=True, text=True, env=env, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cells = json.loads(report.read_text())["cells"]
    assert {(c["backend"], c["point"], c["status"]) for c in cells} == {
        ("postgres", p.partition(":")[0], "pass") for p in POINTS
    }
    decided = {c["point"]: c["decisions"] for c in cells if c["decisions"]}
    assert set(decided) == {"after_tool_started", "after_tool_effect"}  # bash is replay-never
    assert _schemas(pg_cluster) == before  # the run dropped every schema it made


def _schemas(cluster: Any) -> set[str]:
    """The crash-test schemas (``ct_``) in ``cluster``."""
    rows = cluster.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'ct\\_%'")
    return {str(r[0]) for r in rows}
