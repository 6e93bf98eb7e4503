"""``fold`` applies committed ops to lanes without building :func:`lane_change`'s change dict
(it runs for every op of every commit); both must say the same thing about every op."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from durable_harness.storage.base import LaneState
from durable_harness.storage.fold import copy_lane, fold, lane_change


def reference_fold(lanes: dict[str, LaneState], op: dict[str, Any]) -> None:
    """The fold as :func:`lane_change` describes it (the rule before the fast path)."""
    found = lane_change(op)
    if found is None:
        return
    name, change = found
    lane = lanes.get(name)
    if lane is None:
        lane = lanes[name] = LaneState(name)
    if "leaf_id" in change:
        lane.leaf_id = change["leaf_id"]
    if "config" in change:
        lane.config = {**lane.config, **change["config"]}
    if "run" in change:
        lane.run_id, lane.run_seq = change["run"]
    elif "close" in change and lane.run_id == change["close"]:
        lane.run_id, lane.run_seq = None, None


names = st.sampled_from(["main", "side", "other"])
maybe_names = st.one_of(st.none(), names)
runs = st.one_of(st.none(), st.sampled_from(["r1", "r2"]))
rtypes = st.sampled_from(["run_started", "run_finished", "save_point", "tool_started"])


@st.composite
def ops(draw: st.DrawFn) -> dict[str, Any]:
    seq = draw(st.integers(1, 1000))
    kind = draw(st.sampled_from(["entry", "record", "lane"]))
    if kind == "entry":
        op: dict[str, Any] = {"op": "entry", "entry": {"id": f"e{seq}", "seq": seq}}
        lane = draw(maybe_names)
        if lane is not None:
            op["lane"] = lane
        return op
    if kind == "record":
        rec = {"type": draw(rtypes), "id": f"r{seq}", "seq": seq, "lane": draw(maybe_names)}
        run = draw(runs)
        if run is not None:
            rec["runId"] = run
        return {"op": "record", "record": rec}
    op = {"op": "lane", "lane": draw(names), "seq": seq}
    if draw(st.booleans()):
        op["leafId"] = draw(st.one_of(st.none(), st.sampled_from(["e1", "e2"])))
    config = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from("ab"), st.integers())))
    if config is not None:
        op["config"] = config
    return op


@given(st.lists(ops(), max_size=30))
def test_fold_agrees_with_lane_change(batch: list[dict[str, Any]]) -> None:
    fast: dict[str, LaneState] = {"main": LaneState("main")}
    slow: dict[str, LaneState] = {"main": LaneState("main")}
    for op in batch:
        fold(fast, op)
        reference_fold(slow, op)
        assert {k: copy_lane(v) for k, v in fast.items()} == slow


def test_an_unknown_op_changes_nothing() -> None:
    lanes = {"main": LaneState("main", leaf_id="e1")}
    fold(lanes, {"op": "later_kind", "lane": "side"})
    assert lanes == {"main": LaneState("main", leaf_id="e1")}
