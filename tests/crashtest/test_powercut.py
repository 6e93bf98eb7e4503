"""Power cuts: the store is cut back to what its own barriers made durable, then recovered.

(a) the barrier trace is off unless its variable is set; (b) a cut JSONL file / SQLite WAL keeps
every waited commit and loses the unwaited ones (sync, batch), loses everything written in
``none``, and opens without damage; (c, crash) a sample of matrix cells per backend and mode:
``sync`` loses no accepted input, no mode runs a replay-never tool twice; (d) the CLI names the
mode of every cell and exits 0 for the losses ``none`` is allowed; (e) a loss in ``sync`` is an
invariant failure, the same loss in ``batch``/``none`` is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest import powercut
from durable_harness.crashtest.runner import Cell, baseline, run_cell
from durable_harness.crashtest.scenario import load_all
from durable_harness.storage import RecordOp, SqliteSessionStore, open_store
from durable_harness.storage.barrier_trace import TRACE_ENV

_SCRIPT = Path(sys.executable).with_name("durable-harness")
DH = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "durable_harness"]


_WRITER = """
import os, sys
from durable_harness.storage import EntryOp, RecordOp, open_store


def rec(rid):
    return {"type": "note", "id": rid, "lane": "main", "timestamp": "2026-01-01T00:00:00.000Z"}


def ent(eid):
    return {"type": "custom", "customType": "t", "id": eid, "parentId": None,
            "timestamp": "2026-01-01T00:00:00.000Z"}


s = open_store(sys.argv[1]).create_session("/w", durability=sys.argv[2])
s.commit([EntryOp(ent("e0"), lane="main"), RecordOp(rec("r0"))])
s.commit([RecordOp(rec("r1"))])
s.commit([RecordOp(rec("r2"))], wait=False)
assert [r["id"] for r in s.records()] == ["r0", "r1", "r2"]
print(s.session_id, flush=True)
os._exit(0)  # dies with the session open: no close, no close-time fsync or checkpoint
"""


def _crashed_writer(spec: str, mode: str, trace: Path) -> str:
    """In a child process with the barrier trace on: create a session in ``mode``, commit r0
    and r1 waited and r2 unwaited, and die without closing. Returns the session id."""
    env = {**os.environ, TRACE_ENV: str(trace)}
    proc = subprocess.run(
        [sys.executable, "-c", _WRITER, spec, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.strip()


def ids(items: list[dict[str, Any]]) -> list[str]:
    """The ``id`` of each record, in order."""
    return [str(i["id"]) for i in items]


def test_trace_is_off_without_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    for spec in (f"jsonl:{tmp_path / 'home'}", f"sqlite:{tmp_path / 'db'}"):
        with open_store(spec).create_session("/w") as s:
            s.commit([RecordOp({"type": "note", "id": "r0", "lane": "main"})])
            # one `is None` test per fsync, nothing else (SQLite: the store's shared writer's)
            owner = s._shared if isinstance(s, SqliteSessionStore) else s.file
            assert owner._trace is None
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("mode", ["sync", "batch", "none"])
def test_jsonl_cut_keeps_exactly_the_synced_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    spec = f"jsonl:{tmp_path / 'home'}"
    sid = _crashed_writer(spec, mode, tmp_path / "trace")
    store = open_store(spec)
    cuts = powercut.cut_jsonl(tmp_path / "home", str(tmp_path / "trace"))
    assert len(cuts) == 1 and sid in cuts[0]
    with store.open_session(sid) as after:
        assert after.damage == []
        assert ids(after.records()) == ([] if mode == "none" else ["r0", "r1"])


@pytest.mark.parametrize("mode", ["sync", "batch", "none"])
def test_sqlite_cut_keeps_exactly_the_synced_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    db = tmp_path / "store.db"
    sid = _crashed_writer(f"sqlite:{db}", mode, tmp_path / "trace")
    wal_before = (tmp_path / "store.db-wal").stat().st_size
    (cut,) = powercut.cut_sqlite(db, str(tmp_path / "trace"))
    assert f"{wal_before} ->" in cut
    assert not (tmp_path / "store.db-shm").exists()
    with open_store(f"sqlite:{db}").open_session(sid) as after:
        assert [d for d in after.damage if d["kind"] != "truncated"] == []
        assert ids(after.records()) == ([] if mode == "none" else ["r0", "r1"])


def test_sync_loss_is_an_invariant_failure_other_modes_only_report_it(tmp_path: Path) -> None:
    for mode, failing in (("sync", True), ("batch", False), ("none", False)):
        cut = powercut.PowerCut(mode, tmp_path)
        cut.lost = {"inputs": ["step-0"], "intents": ["i1"]}
        assert bool(cut.failures()) is failing
    cells = [
        Cell("s", "jsonl", "p", 1, durability="none", lost={"inputs": ["step-0"]}),
        Cell("s", "jsonl", "q", 1, durability="none"),
        Cell(
            "s",
            "jsonl",
            "p",
            1,
            status="fail",
            durability="sync",
            failures=["effects: applied twice: t"],
        ),
    ]
    rows = {r["durability"]: r for r in powercut.summary_rows(cells)}
    assert rows["none"]["cells"] == 2 and rows["none"]["lost_inputs"] == 1
    assert rows["sync"]["doubled_effects"] == 1 and rows["sync"]["failed"] == 1
    assert "| jsonl | none | 2 | 1 |" in powercut.summary_markdown(cells)


# A sample of the power-cut matrix (the whole of it runs with `make crash-test`): one scenario
# per backend and mode, at the point just after the effect, and just after the commit that
# holds the settlement with the save point and the next provider request (merged commits,
# design/crash-matrix.md: that commit's barrier syncs the settlement before the request).
SAMPLE_POINTS = (("after_tool_effect", 1), ("after_provider_request_started", 2))


@pytest.mark.crash
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
@pytest.mark.parametrize("mode", ["sync", "batch", "none"])
def test_power_cut_sample(backend: str, mode: str) -> None:
    (sc,) = load_all(names=["single_tool"])
    base = baseline(sc, backend, durability=mode)
    cells = [
        run_cell(sc, base, Cell(sc.name, backend, point, hit, durability=mode))
        for point, hit in SAMPLE_POINTS
    ]
    for c in cells:
        assert c.status == "pass", (c.label, c.failures)
        assert c.durability == mode
        assert not any(f.startswith("effects") for f in c.failures)  # never a doubled effect
        if mode != "none":
            assert not c.lost.get("inputs")  # sync and batch wait for the input's fsync
    by_point = {c.point: c for c in cells}
    finished = by_point["after_provider_request_started"]
    if mode == "none":
        # nothing was ever synced: the acknowledged prompt, the intent, the settlement are gone,
        # and nothing re-ran the tool (the effects check above)
        assert finished.lost["inputs"] == ["step-0"]
        assert finished.lost["intents"] and finished.lost["settlements"]
    else:
        # the settlement was written with the next request's intent and synced by its
        # barrier: nothing is lost and no call waits for a decision
        assert not any(finished.lost.values()), finished.lost
        assert not finished.decisions


@pytest.mark.crash
@pytest.mark.timeout(240)
def test_cli_power_cut_names_every_cells_mode(tmp_path: Path) -> None:
    report = tmp_path / "m.json"
    base = [*DH, "crash-test", "--scenario", "single_tool", "--backend", "sqlite"]
    proc = subprocess.run(
        [*base, "--power-cut", "--durability", "none", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["cells"] and {c["durability"] for c in data["cells"]} == {"none"}
    assert any(c["lost"].get("inputs") for c in data["cells"])  # allowed in none: exit 0
    (row,) = data["summary"]["power_cut"]
    assert row["durability"] == "none" and row["doubled_effects"] == 0
    assert "sqlite, power cut, durability none" in proc.stdout
    bad = subprocess.run(
        [*base, "--durability", "sync"], capture_output=True, text=True, check=False
    )
    assert bad.returncode != 0 and "--power-cut" in bad.stderr
