"""Generated crash cells: hypothesis draws a short scenario (a prompt; maybe a steer, a
follow-up, a deferred model change, an abort; tool calls with assorted side effects), writes it
as a scenario file, runs it crash-free to learn which crash points it reaches, draws one of
those points (and which hit of it), and runs that matrix cell: it must pass every invariant.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from durable_harness.crashtest.runner import MAX_HITS, Cell, baseline, run_cell
from durable_harness.crashtest.scenario import load

KINDS = ("bash", "append_file", "write_file", "read_file")


def tool_call(kind: str, tag: str) -> dict[str, Any]:
    """One tool call of ``kind`` whose side effect (if any) is tagged ``tag``."""
    if kind == "bash":
        return {"name": "bash", "arguments": {"command": f"echo {tag} >> effects.log"}}
    if kind == "append_file":
        return {"name": "append_file", "arguments": {"path": "effects.log", "content": f"{tag}\n"}}
    if kind == "write_file":
        return {"name": "write_file", "arguments": {"path": f"{tag}.txt", "content": f"{tag}\n"}}
    return {"name": "read_file", "arguments": {"path": "input.txt"}}


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A scenario file's content (see ``durable_harness.crashtest.scenario``)."""
    abort = draw(st.booleans())
    steer = draw(st.booleans())
    follow_up = draw(st.booleans())
    set_model = draw(st.booleans())
    n_tool_turns = draw(st.integers(1, 2))
    turns: list[dict[str, Any]] = []
    for t in range(1, n_tool_turns + 1):
        if abort and t == 1:
            # an abort needs a tool that is still running when it arrives (as abort.json)
            calls = [{"name": "bash", "arguments": {"command": "echo x1 >> effects.log; sleep 1"}}]
        else:
            kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=2))
            calls = [tool_call(k, f"g{t}{i}") for i, k in enumerate(kinds)]
        turns.append({"text": f"Turn {t}.", "tool_calls": calls})
    turns.append({"text": "I would stop here."})
    if follow_up:
        kind = draw(st.sampled_from(KINDS))
        turns.append({"text": "Following up.", "tool_calls": [tool_call(kind, "gf")]})
        turns.append({"text": "Done after the follow-up."})
    steps: list[dict[str, Any]] = [{"op": "prompt", "text": "generated"}]
    if steer:
        steps.append({"op": "steer", "text": "a steer"})
    if follow_up:
        steps.append({"op": "follow_up", "text": "one more thing"})
    if set_model:
        steps.append(
            {
                "op": "set_model",
                "provider": "scripted",
                "model": "scripted-2",
                "on": "tool_execution_start",
            }
        )
    if abort:
        steps.append({"op": "abort", "on": "tool_execution_start"})
    steps.append({"op": "wait"})
    return {
        "name": "generated",
        "description": "drawn by hypothesis",
        "files": {"input.txt": "hello\n"},
        "turns": turns,
        "steps": steps,
    }


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.timeout(600)
@settings(
    # each example is a scenario run twice in child processes: 10 under ci, 3 under dev
    max_examples=max(3, settings.default.max_examples // 6),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), scenario=scenarios(), backend=st.sampled_from(["jsonl", "sqlite"]))
def test_generated_cell_passes(data: st.DataObject, scenario: dict[str, Any], backend: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="dh-stateful-"))
    try:
        path = folder / "generated.json"
        path.write_text(json.dumps(scenario, indent=1))
        note(json.dumps(scenario))
        sc = load(path)
        base = baseline(sc, backend)
        assert base.hits, "the crash-free run reached no crash point"
        assert base.hits["after_run_started"] == 1
        point = data.draw(st.sampled_from(sorted(base.hits)), label="point")
        hit = data.draw(st.integers(1, min(base.hits[point], MAX_HITS)), label="hit")
        cell = run_cell(sc, base, Cell(sc.name, backend, point, hit))
        assert cell.status == "pass", (cell.label, cell.failures, cell.plan, cell.decisions)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
