"""``durable_harness.testing``: crash-test your own agent (design/testing-kit.md).

* A pytest plugin (:mod:`.plugin`, loaded through the ``pytest11`` entry point): the
  :func:`crash_matrix` decorator and the ``crash_cell`` / ``crash_run`` fixtures run a scenario
  that names *your* tools (``"tools": "module:function"``) and provider in a child process,
  SIGKILL it at each crash point it reaches, recover, decide, resume and check the invariants
  (:data:`INVARIANTS`).
* Power cuts: ``crash_matrix(..., power_cut=True)``, ``run_crash(..., power_cut="sync")``
  cut the store back to what the durability mode had made durable before recovering
  (:data:`POWER_CUT_MODES`, ``CrashOutcome.lost``).
* :func:`run_crash`, :func:`crash_points`, :func:`scenario`: the same without pytest.
* :func:`assert_intent_durable`: the write-ahead check, from a second reader.
* :func:`check_session_store`: the storage conformance suite for a third-party backend.
* :class:`Tool`, :class:`ToolResult`, :class:`ToolContext`: the tool protocol, re-exported so
  a test suite needs nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durable_harness.crashtest.runner import Cell, Decide, default_decision
from durable_harness.crashtest.scenario import Scenario
from durable_harness.testing.conformance import check_session_store
from durable_harness.testing.intent import assert_intent_durable, open_reader
from durable_harness.testing.kit import (
    INVARIANTS,
    POWER_CUT_MODES,
    CrashOutcome,
    crash_free,
    crash_points,
    run_crash,
    scenario,
)
from durable_harness.tools.base import Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from durable_harness.testing.plugin import crash_matrix

__all__ = [
    "INVARIANTS",
    "POWER_CUT_MODES",
    "Cell",
    "CrashOutcome",
    "Decide",
    "Scenario",
    "Tool",
    "ToolContext",
    "ToolResult",
    "assert_intent_durable",
    "check_session_store",
    "crash_free",
    "crash_matrix",
    "crash_points",
    "default_decision",
    "open_reader",
    "run_crash",
    "scenario",
]


def __getattr__(name: str) -> Any:
    """``crash_matrix`` is imported on first use: it needs pytest, which only test suites
    install."""
    if name == "crash_matrix":
        from durable_harness.testing.plugin import crash_matrix

        return crash_matrix
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
