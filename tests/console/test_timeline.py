"""The run timeline drawn from an operation log (``durable_harness/console/timeline.py``)."""

from __future__ import annotations

import itertools
from typing import Any

from durable_harness.console.timeline import GAP_W, build_timeline
from durable_harness.host.read_model import parse_ts


def rec(t: float, rtype: str, **fields: Any) -> dict[str, Any]:
    ms = round(t * 1000)
    stamp = f"2026-01-31T12:{ms // 60000:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}Z"
    return {"type": rtype, "timestamp": stamp, "lane": "main", "runId": "r1", **fields}


def crashed_log() -> list[dict[str, Any]]:
    """A run: a failed provider attempt, its retry, a tool call, a queue receipt, a save point;
    a second tool call whose generation dies before it settles; the next generation starts
    ten minutes later and settles it by a decision."""
    return [
        rec(0.0, "run_started"),
        rec(0.1, "provider_request_started", turn=1, attempt=1),
        rec(0.3, "provider_request_failed", turn=1, attempt=1, status=503, retryable=True),
        rec(0.4, "provider_request_started", turn=1, attempt=2),
        rec(0.9, "provider_request_finished", turn=1, attempt=2),
        rec(1.0, "tool_started", toolCallId="c1", callKey="e/0", toolName="read", attempt=1),
        rec(1.2, "tool_finished", toolCallId="c1", callKey="e/0", outcome="ok"),
        rec(1.25, "queue_enqueued", queue="steer", itemId="q1"),
        rec(1.3, "save_point", turn=1),
        rec(1.4, "tool_started", toolCallId="c2", callKey="e/1", toolName="bash", attempt=1),
        rec(1.5, "tool_process", toolCallId="c2", callKey="e/1", pgid=4242),
        rec(601.5, "session_lifecycle", state="idle", generation=2, runId=None),
        rec(601.6, "decision", toolCallId="c2", callKey="e/1", decision="result"),
        rec(601.7, "tool_finished", toolCallId="c2", callKey="e/1", outcome="decided_result"),
        rec(601.9, "abort_requested"),
        rec(602.0, "run_finished", outcome="aborted"),
    ]


def test_every_kind_of_record_is_drawn() -> None:
    tl = build_timeline(crashed_log(), live=True)
    assert not tl.empty
    (run,) = tl.of_kind("run")
    assert run.cls == "run outcome-aborted"
    attempts = tl.of_kind("provider")
    assert [a.cls for a in attempts] == ["provider failed", "provider"]
    assert "503" in attempts[0].title and "retryable" in attempts[0].title
    assert attempts[0].x + attempts[0].w <= attempts[1].x  # the retry comes after the failure
    tools = tl.of_kind("tool")
    assert [t.cls for t in tools] == ["tool outcome-ok", "tool outcome-decided_result in-doubt"]
    for kind in ("queue", "save-point", "process", "lifecycle", "decision", "abort"):
        assert len(tl.of_kind(kind)) == 1, kind


def test_the_crash_is_a_gap_and_the_in_doubt_window_crosses_it() -> None:
    tl = build_timeline(crashed_log(), live=True)
    gaps = [g for g in tl.of_kind("gap") if "crash" in g.cls]
    assert len(gaps) == 1
    gap = gaps[0]
    assert gap.w == GAP_W  # ten minutes drawn compressed, labelled with its real length
    assert "10 min 0 s" in gap.title
    assert any("10 min 0 s" in t.text for t in tl.ticks)
    doubt = tl.of_kind("tool")[1]
    assert doubt.x < gap.x and doubt.x + doubt.w > gap.x + gap.w
    (process,) = tl.of_kind("process")
    (lifecycle,) = tl.of_kind("lifecycle")
    assert process.x <= gap.x and lifecycle.x >= gap.x + gap.w
    # the 1.5 s of activity before the crash gets far more room than the gap
    (run,) = tl.of_kind("run")
    assert gap.x - run.x > 5 * GAP_W


def test_a_session_with_no_owner_ends_in_a_crash_gap_up_to_now() -> None:
    log = crashed_log()[:11]  # the generation died; nothing after it
    now = parse_ts(log[-1]["timestamp"])
    assert now is not None
    tl = build_timeline(log, live=False, now=now + 3600)
    (gap,) = [g for g in tl.of_kind("gap") if "crash" in g.cls]
    doubt = tl.of_kind("tool")[1]
    assert doubt.cls == "tool in-doubt" and "still open" in doubt.title
    assert doubt.x + doubt.w >= gap.x + gap.w - 0.5
    assert "1 h 00 min" in gap.title
    # while live, an open call is not in doubt and there is no gap
    live = build_timeline(log, live=True, now=now + 3600)
    assert live.of_kind("gap") == [] and "in-doubt" not in live.of_kind("tool")[1].cls


def test_a_quiet_stretch_is_compressed_but_not_a_crash() -> None:
    log = [
        rec(0.0, "run_started"),
        rec(0.5, "run_finished", outcome="completed"),
        rec(3000.0, "run_started", runId="r2"),
        rec(3000.5, "run_finished", outcome="completed", runId="r2"),
    ]
    tl = build_timeline(log, live=True)
    (gap,) = tl.of_kind("gap")
    assert gap.cls == "gap quiet" and gap.w == GAP_W
    a, b = tl.of_kind("run")
    assert a.w > 100 and b.w > 100  # half-second runs stay visible beside 50 minutes


def test_records_without_a_timestamp_draw_nothing() -> None:
    assert build_timeline([{"type": "run_started"}], live=False, now=0.0).empty
    assert build_timeline([], live=True).empty


def test_a_run_finished_after_a_decision_says_so() -> None:
    from durable_harness.recovery.explain import clock

    log = crashed_log()
    tl = build_timeline(log, live=False, now=parse_ts(log[-1]["timestamp"]))
    at = clock(log[-1]["timestamp"])
    (run,) = tl.of_kind("run")
    assert run.label == f"run aborted {at}"
    assert tl.notes == [
        f"run r1 on lane main: aborted {at}, after the decision at {clock(log[-4]['timestamp'])}"
    ]
    plain = [r for r in log if r["type"] != "decision"]
    assert build_timeline(plain, live=False).notes == []


def test_labels_fit_their_bars_and_ticks_never_overlap() -> None:
    """Every label is cut to its room (monospace metrics of console.css): a bar's label is
    no wider than the bar, row labels stay in the gutter, ticks on one line do not overlap,
    and nothing leaves the drawing, with many gaps close together and a long lane name."""
    from durable_harness.console.timeline import CHAR_W, GUTTER, ROW_CHAR_W, WIDTH

    log: list[dict[str, Any]] = []
    t = 0.0
    for i in range(12):  # a dozen runs, each after a long quiet stretch
        lane = "a-very-long-lane-name-indeed" if i % 2 else "main"
        log.append(rec(t, "run_started", lane=lane, runId=f"run-{i:04d}-xxxxxxxx"))
        log.append(
            rec(
                t + 0.5,
                "tool_started",
                lane=lane,
                runId=f"run-{i:04d}-xxxxxxxx",
                toolCallId=f"c{i}",
                callKey=f"e/{i}",
                toolName="a_tool_with_a_long_name",
            )
        )
        log.append(
            rec(
                t + 0.9,
                "tool_finished",
                lane=lane,
                runId=f"run-{i:04d}-xxxxxxxx",
                toolCallId=f"c{i}",
                callKey=f"e/{i}",
                outcome="ok",
            )
        )
        log.append(
            rec(
                t + 1.0,
                "run_finished",
                lane=lane,
                runId=f"run-{i:04d}-xxxxxxxx",
                outcome="completed",
            )
        )
        t += 3000.0 + i
    tl = build_timeline(log, live=True)
    for s in tl.shapes:
        if s.label:
            assert len(s.label) * CHAR_W <= s.w, (s.label, s.w)
    for _y, text in tl.rows:
        assert len(text) * ROW_CHAR_W <= GUTTER, text
    assert any("…" in text for _y, text in tl.rows)
    for line in (0, 1):
        spans = sorted(
            (t.x - len(t.text) * CHAR_W / 2, t.x + len(t.text) * CHAR_W / 2)
            for t in tl.ticks
            if t.line == line
        )
        for (_a0, a1), (b0, _b1) in itertools.pairwise(spans):
            assert a1 <= b0, spans
        assert all(a >= GUTTER and b <= WIDTH for a, b in spans)
    assert any(t.line == 0 for t in tl.ticks) and any(t.line == 1 for t in tl.ticks)
