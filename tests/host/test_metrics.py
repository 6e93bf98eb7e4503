"""``HostMetrics``: the counters, gauges and histograms of ``/metrics`` (issue 12), fed by the
events of real harness runs on a real JSONL store and by storage timing."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from durable_harness.host.metrics import MAX_TOOL_LABELS, HostMetrics
from durable_harness.storage import RecordOp, open_store
from durable_harness.storage.jsonl import framing
from durable_harness.testing.conformance import rec

from .obs_util import (
    TOKENS,
    commit_lines,
    crashed_in_doubt,
    resume_with,
    samples,
    two_runs,
    value,
)

P = "durable_harness_"


def test_runs_turns_tool_calls_requests_and_tokens(tmp_path: Path) -> None:
    with HostMetrics() as metrics:
        runs = two_runs(tmp_path, [metrics.observe])
        body, content_type = metrics.render()
    assert runs.outcomes == ["completed", "failed"]
    assert content_type.startswith("text/plain; version=0.0.4")
    got = samples(body)
    assert value(got, P + "runs_started_total") == 2
    assert value(got, P + "runs_total", outcome="completed") == 1
    assert value(got, P + "runs_total", outcome="failed") == 1
    assert value(got, P + "runs_total", outcome="aborted") == 0
    # run 1: two turns; run 2: turn 1, and turn 2 whose attempts all failed
    assert value(got, P + "turns_total") == 4
    assert value(got, P + "tool_calls_total", tool="read_file", outcome="ok") == 1
    assert value(got, P + "tool_calls_total", tool="bash", outcome="ok") == 1
    assert value(got, P + "tool_calls_total", tool="read_file", outcome="error") == 1
    assert value(got, P + "tool_call_seconds_count", tool="read_file") == 2
    assert value(got, P + "tool_call_seconds_count", tool="bash") == 1
    assert value(got, P + "provider_requests_total", purpose="turn", outcome="ok") == 3
    assert value(got, P + "provider_requests_total", purpose="turn", outcome="error") == 2
    assert value(got, P + "provider_request_seconds_count", purpose="turn") == 5
    for kind, count in TOKENS.items():
        assert value(got, P + "tokens_total", kind=kind) == count, kind
    assert value(got, P + "tool_calls_awaiting_decision") == 0


def test_commit_and_fsync_histograms_count_every_write_of_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit line the runs wrote is one ``commit`` observation, every ``fdatasync``
    of the session file one ``fsync`` observation."""
    metrics = HostMetrics()
    fsyncs: list[int] = []
    real_fdatasync = os.fdatasync

    def counting(fd: int) -> None:
        fsyncs.append(fd)
        real_fdatasync(fd)

    lines_before: list[int] = []

    def start() -> None:
        lines_before.append(commit_lines(next((tmp_path / "home").rglob("*.jsonl"))))
        metrics.start()
        monkeypatch.setattr(framing.os, "fdatasync", counting)

    runs = two_runs(tmp_path, [metrics.observe], before=start)
    metrics.close()
    monkeypatch.undo()
    got = samples(metrics.render()[0])
    written = commit_lines(runs.path) - lines_before[0]
    assert written > 10
    assert value(got, P + "commit_seconds_count") == written
    assert len(fsyncs) > 0
    assert value(got, P + "fsync_seconds_count") == len(fsyncs)
    assert 0 < value(got, P + "fsync_seconds_sum") < 60
    # the buckets are cumulative and end with every observation in +Inf
    assert value(got, P + "fsync_seconds_bucket", le="+Inf") == len(fsyncs)


def test_closed_metrics_stop_listening_and_hosts_do_not_share_series(tmp_path: Path) -> None:
    first, second = HostMetrics().start(), HostMetrics().start()
    session = open_store(f"jsonl:{tmp_path}").create_session(str(tmp_path), durability="sync")
    session.commit([RecordOp(rec("r1"))])
    first.close()
    session.commit([RecordOp(rec("r2"))])
    second.close()
    session.commit([RecordOp(rec("r3"))])
    session.close()
    assert value(samples(first.render()[0]), P + "commit_seconds_count") == 1
    assert value(samples(second.render()[0]), P + "commit_seconds_count") == 2
    first.observe("s1", {"type": "run_start", "lane": "main", "runId": "r"})
    assert value(samples(second.render()[0]), P + "runs_started_total") == 0


def test_awaiting_gauge_follows_a_real_in_doubt_call_and_the_manager(tmp_path: Path) -> None:
    spec, sid, work = crashed_in_doubt(tmp_path)
    metrics = HostMetrics()

    def awaiting() -> float:
        return value(samples(metrics.render()[0]), P + "tool_calls_awaiting_decision")

    outcome, waiting = resume_with(spec, sid, work, [metrics.observe])
    assert (outcome, len(waiting)) == ("suspended", 1)
    assert awaiting() == 1  # counted from the live generation's run_end
    got = samples(metrics.render()[0])
    assert value(got, P + "runs_total", outcome="suspended") == 1
    # the generation ends: its live count goes; the manager reports the plan's count instead
    metrics.observe(sid, {"type": "lifecycle", "state": "suspended"})
    assert awaiting() == 0
    metrics.set_awaiting(sid, 1)
    metrics.set_awaiting("other-session", 2)
    assert awaiting() == 3
    metrics.set_awaiting_counts({"other-session": 1})
    assert awaiting() == 1
    # the decision arrives: the session resumes (plan cleared by the manager) and finishes
    metrics.set_awaiting_counts({sid: 1, "other-session": 1})
    metrics.set_awaiting(sid, 0)
    decisions = {waiting[0]: {"decision": "result", "result": "it ran"}}
    outcome, waiting = resume_with(spec, sid, work, [metrics.observe], decisions)
    assert (outcome, waiting) == ("completed", [])
    got = samples(metrics.render()[0])
    assert value(got, P + "tool_calls_total", tool="bash", outcome="decided_result") == 1
    assert value(got, P + "runs_total", outcome="completed") == 1
    assert awaiting() == 1
    metrics.forget_session("other-session")
    assert awaiting() == 0
    # the crash came before the effect and the decision settled the call: bash never ran
    assert not (work / "effects.log").exists()
    with pytest.raises(ValueError, match="negative"):
        metrics.set_awaiting(sid, -1)


def test_live_suspension_per_lane_and_forget() -> None:
    metrics = HostMetrics()
    end = {"type": "run_end", "outcome": "suspended"}
    metrics.observe("s1", {**end, "lane": "main", "runId": "a", "awaiting": ["c1", "c2"]})
    metrics.observe("s1", {**end, "lane": "side", "runId": "b", "awaiting": ["c3"]})
    metrics.observe("s2", {**end, "lane": "main", "runId": "c", "awaiting": ["c4"]})
    got = samples(metrics.render()[0])
    assert value(got, P + "tool_calls_awaiting_decision") == 4
    metrics.observe("s1", {"type": "run_start", "lane": "main", "runId": "a"})  # resumed
    assert value(samples(metrics.render()[0]), P + "tool_calls_awaiting_decision") == 2
    metrics.forget_session("s1")
    assert value(samples(metrics.render()[0]), P + "tool_calls_awaiting_decision") == 1


def test_sessions_by_state_from_the_refresh_hook() -> None:
    counts = [{"idle": 2, "running": 1}, {"idle": 3}]
    metrics = HostMetrics(refresh=lambda m: m.set_state_counts(counts.pop(0)))
    got = samples(metrics.render()[0])
    assert value(got, P + "sessions", state="idle") == 2
    assert value(got, P + "sessions", state="running") == 1
    got = samples(metrics.render()[0])
    assert value(got, P + "sessions", state="idle") == 3
    assert value(got, P + "sessions", state="running") == 0


def test_openmetrics_when_the_scraper_asks_for_it() -> None:
    metrics = HostMetrics()
    metrics.observe("s", {"type": "turn_start", "lane": "main", "runId": "r", "turn": 1})
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert b"durable_harness_turns_total 1.0" in body


def test_a_bad_event_or_hook_is_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    def broken(m: HostMetrics) -> None:
        raise RuntimeError("state source down")

    metrics = HostMetrics(refresh=broken)
    with caplog.at_level(logging.ERROR, logger="durable_harness.host.metrics"):
        # ``awaiting`` must be a list: a number breaks the count after the outcome was taken
        bad = {"type": "run_end", "lane": "main", "runId": "r", "outcome": "suspended"}
        metrics.observe("s", {**bad, "awaiting": 5})
        body, _ = metrics.render()
    assert "cannot count event" in caplog.text and "refresh hook failed" in caplog.text
    assert value(samples(body), P + "runs_total", outcome="suspended") == 1


def test_tool_names_beyond_the_cap_count_as_other() -> None:
    """A model may call tools that do not exist, under any name: the series stay bounded."""
    metrics = HostMetrics()
    names = [f"made_up_{i}" for i in range(MAX_TOOL_LABELS + 5)] + ["x" * 65]
    for i, name in enumerate(names):
        end = {"type": "tool_execution_end", "lane": "main", "runId": "r", "toolCallId": str(i)}
        metrics.observe("s", {**end, "toolName": name, "outcome": "error", "isError": True})
    got = samples(metrics.render()[0])
    tools = {dict(labels)["tool"] for name, labels in got if name == P + "tool_calls_total"}
    assert tools == {*names[:MAX_TOOL_LABELS], "other"}
    assert value(got, P + "tool_calls_total", tool="other", outcome="error") == 6
    # a name already in use keeps its own series
    metrics.observe("s", {"type": "tool_execution_end", "toolName": names[0], "outcome": "ok"})
    assert (
        value(samples(metrics.render()[0]), P + "tool_calls_total", tool=names[0], outcome="ok")
        == 1
    )


def test_worker_counters_follow_the_workers_totals_and_never_go_down() -> None:
    m = HostMetrics()
    m.set_worker_counts(3, 0, 1)
    m.set_worker_counts(5, 1, 1)
    m.set_worker_counts(5, 1, 1)  # a scrape with nothing new adds nothing
    text = m.render()[0].decode()
    assert "durable_harness_worker_claims_total 5.0" in text
    assert "durable_harness_worker_claim_failures_total 1.0" in text
    assert "durable_harness_worker_sessions_lost_total 1.0" in text
