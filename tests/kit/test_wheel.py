"""The package as a user gets it: a wheel built from the sources, installed into a fresh virtual
environment outside the clone (no system site-packages, no ``PYTHONPATH``), then the README's
"Crash-test your own agent" commands run there exactly as shown, over the README's own
``charge.py`` and ``test_charge.py``: the ``testing`` extra brings pytest, the plugin loads by
its entry point and runs one test per crash point, and ``crash-test`` finds the built-in
scenarios (package data) and writes its HTML report.

The dependencies come from the package index pip is configured with (its cache makes a second
run quicker); the test prints each step's seconds (``-s`` shows them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from .test_external_package import readme_files

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_commands() -> list[str]:
    """The shell lines of the README block after ``<!-- kit-commands -->`` (comments cut)."""
    (block,) = re.findall(r"<!-- kit-commands -->\n```sh\n(.*?)```", README.read_text(), re.S)
    return [ln for ln in block.splitlines() if ln.strip()]


def build_wheel(dest: Path) -> Path:
    """A wheel of the sources, built from a copy (so the clone gets no ``build/`` folder)."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "durable_harness",
        src / "durable_harness",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    out = dest / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("durable_harness-*.whl")
    return wheel


def clean_env(bindir: Path) -> dict[str, str]:
    """The environment of a user's shell: nothing of this test run or of the clone's venv;
    ``python3`` is this interpreter's base Python (the one the project supports)."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_", "DURABLE_", "COV_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.timeout(1200)
def test_wheel_in_a_fresh_venv_runs_the_readme_commands(tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    start = time.monotonic()
    wheel = build_wheel(tmp_path)
    timings["build wheel"] = time.monotonic() - start
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("durable_harness/crashtest/scenarios/")}
    assert "single_tool.json" in shipped and len(shipped) >= 10, shipped

    shop = tmp_path / "shop"  # the user's project: the README's two files, nothing else
    shop.mkdir()
    for name, text in readme_files().items():
        (shop / name).write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)
    (bindir / "python3").symlink_to(base)
    env = clean_env(bindir) | {"DH": str(wheel)}

    outputs: list[str] = []
    for command in readme_commands():
        began = time.monotonic()
        proc = subprocess.run(
            ["/bin/sh", "-ec", command],
            cwd=shop,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        timings[command.split("#")[0].strip()[:60]] = time.monotonic() - began
        assert proc.returncode == 0, (command, proc.stdout[-4000:], proc.stderr[-3000:])
        outputs.append(proc.stdout)

    # the package ran from the fresh venv, not from the clone
    where = subprocess.run(
        [".venv/bin/python", "-c", "import durable_harness; print(durable_harness.__file__)"],
        cwd=shop,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(shop / ".venv")), where
    cfg = (shop / ".venv" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg, cfg

    text = "\n".join(outputs)
    passed = re.findall(r"test_charge\.py::test_charge\[jsonl-(\S+)\] PASSED", text)
    assert len(passed) >= 10 and "after_tool_effect" in passed, text[-3000:]
    assert (shop / "matrix.html").read_text().startswith("<!DOCTYPE html>")
    assert "single_tool" in (shop / "matrix.html").read_text()
    print("\n" + "\n".join(f"{secs:6.1f} s  {what}" for what, secs in timings.items()))
