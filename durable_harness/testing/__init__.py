"""``durable_harness.testing``: crash-test your own agent, with the pytest plugin
(:mod:`.plugin`) or without pytest (:mod:`.kit`); the write-ahead check; the storage
conformance suite; the tool protocol re-exported (``design/testing-kit.md`` "Pieces")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_harness.lazy import lazy_names

if TYPE_CHECKING:
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
    from durable_harness.testing.plugin import crash_matrix
    from durable_harness.tools.base import Tool, ToolContext, ToolResult

#: Where each name is defined; they load on first use, so the plugin loads no crash runner.
_MODULES = {
    "durable_harness.crashtest.runner": ("Cell", "Decide", "default_decision"),
    "durable_harness.crashtest.scenario": ("Scenario",),
    "durable_harness.testing.conformance": ("check_session_store",),
    "durable_harness.testing.intent": ("assert_intent_durable", "open_reader"),
    "durable_harness.testing.kit": (
        *("INVARIANTS", "POWER_CUT_MODES", "CrashOutcome", "crash_free", "crash_points"),
        *("run_crash", "scenario"),
    ),
    "durable_harness.testing.plugin": ("crash_matrix",),
    "durable_harness.tools.base": ("Tool", "ToolContext", "ToolResult"),
}
_SOURCES = {name: module for module, names in _MODULES.items() for name in names}

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


__getattr__ = lazy_names(__name__, _SOURCES, globals())  # crash_matrix also needs pytest
