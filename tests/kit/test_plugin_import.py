"""The pytest plugin loads in every pytest process where the package is installed (a
``pytest11`` entry point), so it must stay cheap: the crash runner is imported only when a
crash test needs it (issue 21)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

KIT = ("durable_harness.crashtest", "durable_harness.testing.kit")


def _loaded_after(code: str, cwd: Path | None = None) -> list[str]:
    """The crash-kit modules loaded once ``code`` ran in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m.startswith({KIT!r})))"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(ast.literal_eval(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_importing_the_plugin_imports_no_runner() -> None:
    assert _loaded_after("import durable_harness.testing.plugin") == []
    assert _loaded_after("from durable_harness.testing import crash_matrix") == []


@pytest.mark.slow
def test_a_pytest_run_without_crash_tests_imports_no_runner(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    code = (
        "import sys, pytest\n"
        "rc = pytest.main(['-q', '-p', 'no:cacheprovider', 'test_plain.py'])\n"
        "assert rc == 0, rc\n"
        "assert 'durable_harness.testing.plugin' in sys.modules  # the entry point loaded it"
    )
    assert _loaded_after(code, cwd=tmp_path) == []


@pytest.mark.slow
def test_the_names_still_load() -> None:
    loaded = _loaded_after("from durable_harness.testing import run_crash, INVARIANTS")
    assert "durable_harness.crashtest.runner" in loaded
