"""The kit from outside: a small package in a temporary folder (not the repository), made of
the README's "Crash-test your own agent" example (a ``charge`` tool over a ledger file and its
pytest file) plus a variant without ``reconcile``, using only the pytest plugin (loaded by its
``pytest11`` entry point) and the public API; pytest runs it in a subprocess.

Checked from here: every crash point a one-tool run passes was a test of its own and passed
(each one asserting the ledger holds the charge once and every invariant held), and the
variant without ``reconcile`` was caught awaiting a decision where the reconciling tool was
not, and its doubled charge (after an explicit retry) was found by the tool's own check.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from durable_harness.crash import CRASH_POINTS
from durable_harness.session.session import Session
from durable_harness.storage import open_store

# every point a run with one tool call passes (all but the queue and abort points, the one
# only the bash tool reaches, and those its merged settlement + save point + next request leave
# out: design/crash-matrix.md, "Merged commits")
RUN_POINTS = set(CRASH_POINTS) - {
    "after_queue_enqueued",
    "after_abort_requested",
    "after_tool_spawned",
    "after_tool_finished",
    "before_save_point",
    "after_save_point",
}

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_files() -> dict[str, str]:
    """The files of the README's "Crash-test your own agent" example, by name (each code block
    follows a ``<!-- kit-example: NAME -->`` line)."""
    found = re.findall(
        r"<!-- kit-example: (\S+) -->\n```python\n(.*?)```", README.read_text(), re.S
    )
    return dict(found)


# The example's tool without reconcile, and the same tool retried by an operator: both must be
# caught (awaiting a decision; the doubled charge found by the tool's own check).
TEST_UNSAFE = """
import charge
from durable_harness.testing import Tool, crash_matrix


class UnsafeCharge(charge.Charge):
    reconcile = Tool.reconcile  # no way to tell, after a crash, whether it charged


def unsafe_tools():
    return [UnsafeCharge()]


from test_charge import SCENARIO

UNSAFE = {**SCENARIO, "name": "unsafe_charge", "tools": "test_unsafe:unsafe_tools"}


def test_unsafe_charge_awaits_a_decision(crash_run):
    out = crash_run(UNSAFE, "after_tool_effect")
    out.assert_invariants()
    assert out.awaiting_decision and not out.reconciled
    assert len(charge.ledger(out.work)) == 1  # the default decision never re-runs it


def test_unsafe_charge_retried_is_doubled(crash_run):
    out = crash_run(UNSAFE, "after_tool_effect", decide=lambda call, ctx: {"decision": "retry"})
    assert len(charge.ledger(out.work)) == 2
    assert [d.split(":", 1)[0] for d in out.doubled] == ["charge"]
"""


@pytest.mark.crash
@pytest.mark.timeout(600)
def test_a_package_outside_the_repo_crash_tests_its_own_tool(tmp_path: Path) -> None:
    pkg = tmp_path / "shop"
    pkg.mkdir()
    files = readme_files()
    assert set(files) == {"charge.py", "test_charge.py"}, set(files)
    for name, text in files.items():
        (pkg / name).write_text(text)
    (pkg / "test_unsafe.py").write_text(TEST_UNSAFE)
    report = tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DURABLE_"))}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-q", "-p", "no:cacheprovider"),
            f"--junitxml={report}",
            f"--basetemp={tmp_path / 'bt'}",
        ],
        cwd=pkg,
        env=env,
        capture_output=True,
        text=True,
        timeout=590,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    cases = {
        c.get("name", ""): [child.tag for child in c]
        for c in ET.parse(report).getroot().iter("testcase")
    }
    assert all(tags == [] for tags in cases.values()), cases  # no failure, error or skip
    labels = {
        name[len("test_charge[jsonl-") : -1]
        for name in cases
        if name.startswith("test_charge[jsonl-")
    }
    # every crash point a one-tool run reaches was a test, and the n-th hits too
    assert {label.partition(":")[0] for label in labels} == RUN_POINTS
    assert "after_provider_request_started:2" in labels
    assert {"test_unsafe_charge_awaits_a_decision", "test_unsafe_charge_retried_is_doubled"} <= set(
        cases
    )
    # from outside, in the folders the cells kept: each ledger holds the one charge once, and
    # the crash after the charge was settled by reconcile, not by a decision
    ledgers = sorted((tmp_path / "bt").glob("test_charge_jsonl_*[0-9]/cell/work/ledger.jsonl"))
    assert len(ledgers) == len(labels)
    for path in ledgers:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == 1 and rows[0]["cents"] == 500, (path, rows)
    (cell,) = (tmp_path / "bt").glob("test_charge_jsonl_after_tool_e[0-9]*/cell")  # names cut at 30
    store = open_store(f"jsonl:{cell / 'home'}", create=False)
    with Session(store.open_session((cell / "sid").read_text(), write=False)) as session:
        finished = session.store.records(types=("tool_finished",))
    assert [r.get("outcome") for r in finished] == ["reconciled"]
