"""``durable-harness demo`` end to end in a child process: a real SIGKILL mid-turn, the recovery
plan, the operator's decision, the resumed run, and the pi import.

The demo runs once per suite (``first_demo``); the second-run test runs it once more, in a copy
of the first run's folder. ``make test`` distributes whole files (``--dist loadfile``), so both
tests share that first run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from durable_harness.storage import open_store

DEPLOY_LINE = "deployed release 1.2"


def _demo_command() -> list[str]:
    script = Path(sys.executable).parent / "durable-harness"
    if script.is_file():
        return [str(script)]
    found = shutil.which("durable-harness")
    return [found] if found else [sys.executable, "-m", "durable_harness"]


def _demo(folder: Path) -> subprocess.CompletedProcess[str]:
    # about 6 s on an idle machine, 40 s seen on 2 busy cores: no time limit here but the
    # tests' generous pytest-timeout
    return subprocess.run(
        [*_demo_command(), "demo", "--dir", str(folder)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=False,
    )


Demo = tuple[subprocess.CompletedProcess[str], Path]


@pytest.fixture(scope="session")
def first_demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """The demo, run once in a fresh folder: its output and the folder (read it, never write)."""
    folder = tmp_path_factory.mktemp("first-demo") / "demo"
    return _demo(folder), folder


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo(first_demo: Demo) -> None:
    proc, folder = first_demo
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "killed by SIGKILL" in out

    # the recovery plan: read_file (replay safe) re-executed, bash (replay never) refused
    assert re.search(r"call_\S+\s+read_file\s+in_doubt\s+safe\s+re-execute", out), out
    assert re.search(r"call_\S+\s+bash\s+in_doubt\s+never\s+await_decision", out), out
    assert "suspended (awaiting_decision)" in out

    # the side effect happened exactly once across the crash and the resume
    log = folder / "project" / "deploy.log"
    assert log.read_text().splitlines() == [DEPLOY_LINE]
    assert (folder / "project" / "NOTES.md").read_text().startswith("# Release 1.2")

    # the pi import step shows the tree, with the main lane's leaf marked
    step5 = out[out.index("5. A real pi session") :]
    assert re.search(r"^a0000001 model_change", step5, re.M), step5
    assert re.search(r"^\s+a0000011 session_info <main>", step5, re.M), step5
    assert "[first-pass]" in step5

    # what the library sees in the demo's store
    store = open_store(f"jsonl:{folder / 'home'}")
    infos = store.list_sessions()
    assert len(infos) == 2
    [run_info] = store.list_sessions(str(folder / "project"))
    with store.open_session(run_info.id, write=False) as s:
        records = s.records()
        assert s.lanes()["main"].run_id is None
    assert [r["outcome"] for r in records if r["type"] == "run_finished"] == ["completed"]
    bash_ids = {r["toolCallId"] for r in records if r.get("toolName") == "bash"}
    assert len(bash_ids) == 1
    finished = [r for r in records if r["type"] == "tool_finished" and r["toolCallId"] in bash_ids]
    assert len(finished) == 1
    decisions = [r for r in records if r["type"] == "decision"]
    assert [d["toolCallId"] for d in decisions] == sorted(bash_ids)


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_again_in_the_same_folder(first_demo: Demo, tmp_path: Path) -> None:
    """A second demo in a used folder judges the deploy by the line it adds, not by the line
    the first demo left: its bash call never ran, so the operator's decision is ``retry``."""
    first, used = first_demo
    assert first.returncode == 0, first.stdout + first.stderr
    folder = tmp_path / "demo"
    shutil.copytree(used, folder, symlinks=True)  # the first run's folder stays as it was
    assert (folder / "project" / "deploy.log").read_text().splitlines() == [DEPLOY_LINE]
    again = _demo(folder)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "=retry" in again.stdout
    log = folder / "project" / "deploy.log"
    assert log.read_text().splitlines() == [DEPLOY_LINE, DEPLOY_LINE]
    store = open_store(f"jsonl:{folder / 'home'}")
    for info in store.list_sessions(str(folder / "project")):
        with store.open_session(info.id, write=False) as s:
            records = s.records()
        outcomes = [r.get("outcome") for r in records if r["type"] == "tool_finished"]
        assert outcomes.count("decided_result") == 0, outcomes
