"""A bounded schemathesis run over the served OpenAPI document finds no 5xx (issue 12, "Must
show"). The schemathesis CLI runs against a real ``durable-harness serve`` child with a
bearer token, every phase (coverage, fuzzing, stateful), valid and invalid data."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOKEN = "fuzz-token"


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_schemathesis_finds_no_server_error(start_server, script, tmp_path):
    cli = Path(sys.executable).with_name("schemathesis")
    if not cli.exists():
        found = shutil.which("schemathesis")
        assert found, "schemathesis is a dev dependency (pip install -e '.[dev]')"
        cli = Path(found)
    server = start_server(None, "--provider", script([{"text": "fuzzed"}]), token=TOKEN)
    proc = subprocess.run(
        [
            str(cli),
            "run",
            f"{server.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--checks",
            "not_a_server_error,status_code_conformance",
            "--max-examples",
            "25",
            "--seed",
            "20261201",
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "--warnings",
            "off",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,  # 25 examples an operation: about 60 s quiet, over 150 s at load 13
        cwd=tmp_path,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "generated" in tail
    assert server.proc.poll() is None, "the server survived the run"
    server.stop()
    log = server.stderr()
    assert "internal error" not in log, log[-4000:]
