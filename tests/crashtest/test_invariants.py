"""The crash kit's invariants are written once (``crashtest/invariants.py``): the runner, the
report and the testing kit use the same list, so none of them can leave one out (the report's
own copy once lacked ``plan``)."""

from __future__ import annotations

from durable_harness import crashtest, testing
from durable_harness.crashtest import invariants, markdown

NAMES = ["inputs", "effects", "damage", "results", "settled", "plan", "conversation"]


def test_one_list_one_function_each() -> None:
    assert [check.__name__ for check in invariants.CHECKS] == NAMES
    assert testing.INVARIANTS is crashtest.INVARIANTS is invariants.INVARIANTS
    assert list(invariants.INVARIANTS) == NAMES
    assert all(meaning and "\n" not in meaning for meaning in invariants.INVARIANTS.values())


def test_the_report_names_every_invariant() -> None:
    summary = {"cells": 0, "passed": 0, "failed": 0, "errors": 0, "decisions": 0}
    md = markdown([], {**summary, "wall_seconds": 0.0, "jobs": 1})
    for name, meaning in invariants.INVARIANTS.items():
        assert f"- **{name}**: {meaning}" in md.splitlines()
