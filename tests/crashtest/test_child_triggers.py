"""A scenario step that waits ``"on"`` an event (``abort``, ``set_model``) runs even when the
event came before the driver reached the step (``crashtest/child.py``).

The runs go on while the driver awaits an earlier step: in ``batch`` mode each accepted input
waits for its fsync in a worker thread, and the ``abort`` scenario's run could emit its
``tool_execution_start`` before the driver had played the steer and the next-run item ahead of
the abort. The trigger, armed only then, never fired: the run completed unaborted (``crash
point not reached (exit 0)`` in the power-cut matrix, about one cell in three).

Here the order is forced, not timed: the side lane's command waits for a file that the main
lane's command writes once it runs, so when ``wait`` on the side lane returns, the main lane's
``tool_execution_start`` has been emitted for sure; its command then holds until it is
aborted (or, without the fix, until its own timeout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest.runner import baseline
from durable_harness.crashtest.scenario import load

MAIN = "echo b1 >> effects.log; touch started; while [ ! -e gate ]; do sleep 0.02; done"
SIDE = "while [ ! -e started ]; do sleep 0.02; done"

SCENARIO: dict[str, Any] = {
    "name": "late_trigger",
    "description": "the abort step is reached after the event it waits on",
    "turns": [],
    "by_prompt": {
        "long": [
            {
                "text": "Long job.",
                "tool_calls": [{"name": "bash", "arguments": {"command": MAIN, "timeout": 10}}],
            },
            {"text": "unreachable"},
        ],
        "side": [
            {"text": "Side.", "tool_calls": [{"name": "bash", "arguments": {"command": SIDE}}]},
            {"text": "Side done."},
        ],
    },
    "steps": [
        {"op": "create_lane", "name": "side"},
        {"op": "prompt", "text": "long"},
        {"op": "prompt", "text": "side", "lane": "side"},
        {"op": "wait", "lane": "side"},
        {"op": "abort", "on": "tool_execution_start"},
        {"op": "wait"},
    ],
}


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_a_step_reached_after_its_event_still_runs(tmp_path: Path) -> None:
    path = tmp_path / "late_trigger.json"
    path.write_text(json.dumps(SCENARIO))
    base = baseline(load(path), "jsonl")
    assert base.hits["after_abort_requested"] == 1, dict(base.hits)
    main = repr(base.conversation["main"])
    assert "Tool call aborted" in main and "unreachable" not in main, main
