"""What a decision may name: one rule, ``recovery.decide.resolve_decisions``. A call in doubt
of a run not being aborted, by call key or by a tool call id naming exactly one; anything else
is refused with a ``RecoveryError`` that names it and lists the calls that can be decided."""

from __future__ import annotations

from typing import Any

import pytest

from durable_harness.errors import RecoveryError
from durable_harness.recovery.decide import plan, resolve_decisions

from .test_plan_table import TOOLS, Log

FAIL = {"decision": "fail"}


def _mixed() -> Log:
    """c1 finished, c2 in doubt, c3 not started."""
    log = Log().start().answer(("c1", "bash"), ("c2", "bash"), ("c3", "bash"))
    return log.started("c1", "bash", "never").finished("c1").started("c2", "bash", "never")


def _refused(log: Log, decisions: dict[str, Any]) -> RecoveryError:
    with pytest.raises(RecoveryError) as caught:
        resolve_decisions(log.snapshot(), decisions, TOOLS)
    with pytest.raises(RecoveryError):  # the planner applies the same rule
        plan(log.snapshot(), TOOLS, decisions=decisions)
    return caught.value


@pytest.mark.parametrize("name", ["nope", "c1", "c3", "a1/0", "a1/2", "a1/9"])
def test_a_name_that_is_no_call_in_doubt_is_refused(name: str) -> None:
    err = _refused(_mixed(), {name: FAIL})
    assert repr(name) in err.message and "sess-1" in err.message
    assert "in doubt: c2 (a1/1)" in err.message  # the calls that can be decided
    assert err.details["unknown"] == [name] and err.details["tool_call_id"] == name
    assert err.details["in_doubt"] == ["c2"] and err.details["call_keys"] == ["a1/1"]


def test_every_unknown_name_is_listed_at_once() -> None:
    err = _refused(_mixed(), {"c2": FAIL, "x": FAIL, "y": FAIL})
    assert err.details["unknown"] == ["x", "y"]


def test_a_call_in_doubt_is_named_by_id_or_key() -> None:
    snap = _mixed().snapshot()
    assert resolve_decisions(snap, {"c2": FAIL}, TOOLS) == {"a1/1": FAIL}
    assert resolve_decisions(snap, {"a1/1": FAIL}, TOOLS) == {"a1/1": FAIL}
    assert resolve_decisions(snap, {}, TOOLS) == {}


def test_nothing_in_doubt_says_so() -> None:
    log = Log().start().answer(("c1", "bash"))
    err = _refused(log, {"c1": FAIL})
    assert "no call of it is in doubt" in err.message and err.details["in_doubt"] == []


def test_calls_of_a_run_being_aborted_take_no_decision() -> None:
    log = Log().start().answer(("c1", "bash")).started("c1", "bash", "never")
    log.rec("abort_requested")
    _refused(log, {"c1": FAIL})


def test_a_damaged_log_puts_unstarted_calls_in_doubt_unless_replay_safe() -> None:
    log = Log().start().answer(("c1", "bash"), ("c2", "read_file"))
    damage = [{"kind": "bad_line", "line": 3, "detail": "not JSON"}]
    snap = log.snapshot(damage=damage)
    assert resolve_decisions(snap, {"c1": FAIL}, TOOLS) == {"a1/0": FAIL}
    with pytest.raises(RecoveryError, match="in doubt: c1"):
        resolve_decisions(snap, {"c2": FAIL}, TOOLS)  # read_file is re-run: nothing to decide
