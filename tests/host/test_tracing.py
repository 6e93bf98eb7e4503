"""``HostTracer``: OpenTelemetry spans for run, turn, provider request and tool call (issue 12),
built from the events of real harness runs and checked through the SDK's in-memory exporter."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.host import tracing
from durable_harness.host.metrics import HostMetrics
from durable_harness.host.tracing import HostTracer
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools

from .obs_util import crashed_in_doubt, resume_with, samples, two_runs, value


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    yield exp
    exp.shutdown()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> HostTracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return HostTracer(provider)


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    """The spans whose parent is ``parent``, in start order."""
    assert parent.context is not None
    out = [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
    return sorted(out, key=lambda s: s.start_time or 0)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_span_tree_of_a_completed_and_a_failed_run(
    tmp_path: Path, tracer: HostTracer, exporter: InMemorySpanExporter
) -> None:
    runs = two_runs(tmp_path, [tracer.observe])
    spans = list(exporter.get_finished_spans())
    run_spans = sorted(
        (s for s in spans if s.name == "durable_harness.run"), key=lambda s: s.start_time or 0
    )
    assert [attrs(s)["durable_harness.run.id"] for s in run_spans] == runs.run_ids
    for span in run_spans:
        assert span.parent is None
        assert attrs(span)["durable_harness.session.id"] == runs.session_id
        assert attrs(span)["durable_harness.lane"] == "main"
    ok_run, failed_run = run_spans
    # every span of the two runs is in one of the two trees, and every trace is one run
    assert {s.context.trace_id for s in spans} == {s.context.trace_id for s in run_spans}
    assert len(spans) == 2 + 4 + 5 + 3  # runs, turns, provider attempts, tool calls

    # run 1: completed; two turns; turn 1 = the request, then read_file and bash
    assert attrs(ok_run)["durable_harness.outcome"] == "completed"
    assert ok_run.status.status_code == StatusCode.UNSET
    # the GenAI conventions count cached input in input_tokens: 100 + 40 cached + 130
    assert attrs(ok_run)["gen_ai.usage.input_tokens"] == 270
    assert attrs(ok_run)["gen_ai.usage.cache_read.input_tokens"] == 40
    assert attrs(ok_run)["gen_ai.usage.output_tokens"] == 16
    turns = children(spans, ok_run)
    assert [(t.name, attrs(t)["durable_harness.turn"]) for t in turns] == [
        ("durable_harness.turn", 1),
        ("durable_harness.turn", 2),
    ]
    first = children(spans, turns[0])
    assert [s.name for s in first[:1]] == ["chat scripted-1"]
    assert sorted(s.name for s in first[1:]) == ["execute_tool bash", "execute_tool read_file"]
    request = first[0]
    assert request.kind == SpanKind.CLIENT
    assert (
        attrs(request).items()
        >= {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "scripted",
            "gen_ai.request.model": "scripted-1",
            "gen_ai.conversation.id": runs.session_id,
            "gen_ai.usage.input_tokens": 140,  # 100 + 40 read from the cache
            "gen_ai.usage.output_tokens": 10,
            "gen_ai.usage.cache_read.input_tokens": 40,
            "durable_harness.turn": 1,
            "durable_harness.attempt": 1,
            "durable_harness.purpose": "turn",
            "durable_harness.outcome": "ok",
            "durable_harness.run.id": runs.run_ids[0],
        }.items()
    )
    # the convention's value, not the message's stopReason "toolUse"
    assert attrs(request)["gen_ai.response.finish_reasons"] == ("tool_call",)
    for tool in first[1:]:
        a = attrs(tool)
        assert a["durable_harness.outcome"] == "ok"
        assert a["gen_ai.tool.name"] == tool.name.split()[-1]
        assert a["gen_ai.tool.call.id"].startswith("call_")
        assert a["durable_harness.session.id"] == runs.session_id
        assert a["gen_ai.conversation.id"] == runs.session_id
        assert tool.status.status_code == StatusCode.UNSET
        # a tool call starts after its turn's request ended, and ends within its turn
        assert request.end_time is not None and tool.start_time is not None
        assert request.end_time <= tool.start_time
        assert tool.end_time is not None and turns[0].end_time is not None
        assert tool.end_time <= turns[0].end_time
    assert [s.name for s in children(spans, turns[1])] == ["chat scripted-1"]

    # run 2: failed; turn 1's read_file failed; turn 2's two attempts failed, then the run
    assert attrs(failed_run)["durable_harness.outcome"] == "failed"
    assert failed_run.status.status_code == StatusCode.ERROR
    turns = children(spans, failed_run)
    assert len(turns) == 2
    first = children(spans, turns[0])
    assert [s.name for s in first] == ["chat scripted-1", "execute_tool read_file"]
    tool = first[1]
    assert attrs(tool)["durable_harness.outcome"] == "error"
    assert tool.status.status_code == StatusCode.ERROR
    attempts = children(spans, turns[1])
    assert [attrs(s)["durable_harness.attempt"] for s in attempts] == [1, 2]
    for attempt in attempts:
        assert attrs(attempt)["durable_harness.outcome"] == "error"
        assert attrs(attempt)["error.type"] == "503"
        assert attempt.status.status_code == StatusCode.ERROR
        assert "scripted failure" in (attempt.status.description or "")
    # the turn that never reached turn_end was ended with its run
    assert turns[1].end_time is not None and failed_run.end_time is not None
    assert turns[1].end_time <= failed_run.end_time


@pytest.mark.slow
def test_resumed_in_doubt_call_spans(
    tmp_path: Path, tracer: HostTracer, exporter: InMemorySpanExporter
) -> None:
    """A run resumed after a real SIGKILL: the suspension (no decision) is a run span of
    outcome ``suspended`` naming the call; the decided call is a zero-length tool span under
    the run (no turn is open when a resumed run settles its calls)."""
    spec, sid, work = crashed_in_doubt(tmp_path)
    outcome, waiting = resume_with(spec, sid, work, [tracer.observe])
    assert outcome == "suspended"
    (suspended,) = exporter.get_finished_spans()
    assert attrs(suspended)["durable_harness.outcome"] == "suspended"
    assert attrs(suspended)["durable_harness.run.awaiting"] == tuple(waiting)
    assert [e.name for e in suspended.events] == ["suspended"]
    exporter.clear()

    decisions = {waiting[0]: {"decision": "result", "result": "it ran"}}
    assert resume_with(spec, sid, work, [tracer.observe], decisions)[0] == "completed"
    spans = list(exporter.get_finished_spans())
    (run,) = [s for s in spans if s.name == "durable_harness.run"]
    assert attrs(run)["durable_harness.run.id"] == attrs(suspended)["durable_harness.run.id"]
    tool, turn = children(spans, run)
    assert tool.name == "execute_tool bash"
    assert attrs(tool)["durable_harness.outcome"] == "decided_result"
    assert attrs(tool)["gen_ai.tool.call.id"] == waiting[0]
    assert tool.start_time is not None and tool.end_time is not None
    assert tool.end_time - tool.start_time < 10_000_000  # ns: opened and ended at settlement
    assert turn.name == "durable_harness.turn" and attrs(turn)["durable_harness.turn"] == 2


def test_open_spans_end_on_forget_and_close(
    tracer: HostTracer, exporter: InMemorySpanExporter
) -> None:
    for sid in ("s1", "s2"):
        tracer.observe(sid, {"type": "run_start", "lane": "main", "runId": "r"})
        tracer.observe(sid, {"type": "turn_start", "lane": "main", "runId": "r", "turn": 1})
        tracer.observe(
            sid,
            {"type": "tool_execution_start", "lane": "main", "runId": "r", "toolCallId": "c",
             "toolName": "bash"},
        )  # fmt: skip
    assert exporter.get_finished_spans() == ()
    tracer.forget_session("s1")
    ended = exporter.get_finished_spans()
    assert {attrs(s)["durable_harness.session.id"] for s in ended} == {"s1"}
    assert len(ended) == 3
    (run,) = [s for s in ended if s.name == "durable_harness.run"]
    assert attrs(run)["durable_harness.ended_by"] == "forget"
    tracer.close()
    assert len(exporter.get_finished_spans()) == 6
    # events of a run this tracer never saw start are ignored, not an error
    tracer.observe("s3", {"type": "turn_end", "lane": "main", "runId": "x", "turn": 1})
    assert len(exporter.get_finished_spans()) == 6


def test_without_opentelemetry_the_tracer_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the module with ``opentelemetry`` unimportable (as without the otel extra)."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    spec = importlib.util.spec_from_file_location("tracing_without_otel", tracing.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not module.available()
    bare = module.HostTracer()
    assert not bare.enabled
    bare.observe("s", {"type": "run_start", "lane": "main", "runId": "r"})
    bare.observe("s", {"type": "run_end", "lane": "main", "runId": "r", "outcome": "completed"})
    bare.forget_session("s")
    bare.close()
    assert tracing.available() and HostTracer().enabled


def test_an_aborted_tool_call_is_traced_and_counted(
    tmp_path: Path, tracer: HostTracer, exporter: InMemorySpanExporter
) -> None:
    """Abort while ``bash`` sleeps: the tool span ends ``aborted`` (an error), the run span
    ``aborted`` (not an error: the user asked), and the metrics count the same."""
    metrics = HostMetrics()
    work = tmp_path / "work"
    work.mkdir()
    session = Session(open_store(f"jsonl:{tmp_path / 'home'}").create_session(str(work)))
    turns = [
        {"text": "Waiting.", "tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}
    ]

    async def main() -> str:
        async with Harness(session, ScriptedProvider(turns), builtin_tools(), cwd=work) as h:
            started = anyio.Event()
            h.subscribe(lambda e: started.set() if e["type"] == "tool_execution_start" else None)
            h.subscribe(tracer.listener(session.id))
            h.subscribe(metrics.listener(session.id))
            handle = await h.prompt("wait a minute")
            with anyio.fail_after(30):
                await started.wait()
                await h.abort()
                return await handle.wait()

    assert anyio.run(main) == "aborted"
    session.close()
    spans = list(exporter.get_finished_spans())
    (run,) = [s for s in spans if s.name == "durable_harness.run"]
    assert attrs(run)["durable_harness.outcome"] == "aborted"
    assert run.status.status_code == StatusCode.UNSET
    (turn,) = children(spans, run)
    request, tool = children(spans, turn)
    assert attrs(request)["durable_harness.outcome"] == "ok"
    assert tool.name == "execute_tool bash"
    assert attrs(tool)["durable_harness.outcome"] == "aborted"
    assert tool.status.status_code == StatusCode.ERROR
    got = samples(metrics.render()[0])
    assert value(got, "durable_harness_tool_calls_total", tool="bash", outcome="aborted") == 1
    assert value(got, "durable_harness_runs_total", outcome="aborted") == 1


def test_compaction_requests_hang_under_the_run_or_stand_alone(
    tmp_path: Path, tracer: HostTracer, exporter: InMemorySpanExporter
) -> None:
    """An automatic compaction between turns is a request span under the run (no turn is
    open); a compaction by hand outside any run is a trace of its own. Both are counted."""
    metrics = HostMetrics()
    work = tmp_path / "work"
    work.mkdir()
    long = "lorem ipsum dolor sit amet " * 24
    (work / "notes.txt").write_text(long)
    session = Session(open_store(f"jsonl:{tmp_path / 'home'}").create_session(str(work)))
    turns = [
        {
            "text": f"Reading. {long}",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
        },
        {"text": "finished after compaction"},
    ]
    provider = ScriptedProvider(turns, context_window=300)
    options = HarnessOptions(compact_reserve=150, keep_recent_tokens=50)

    async def main() -> None:
        async with Harness(session, provider, builtin_tools(), cwd=work, options=options) as h:
            h.subscribe(tracer.listener(session.id))
            h.subscribe(metrics.listener(session.id))
            handle = await h.prompt("short prompt")
            with anyio.fail_after(30):
                assert await handle.wait() == "completed"
                await h.compact()

    anyio.run(main)
    session.close()
    spans = list(exporter.get_finished_spans())
    (run,) = [s for s in spans if s.name == "durable_harness.run"]
    under_run = children(spans, run)
    assert [s.name for s in under_run] == [
        "durable_harness.turn",
        "chat scripted-1",
        "durable_harness.turn",
    ]
    compaction = under_run[1]
    assert attrs(compaction)["durable_harness.purpose"] == "compaction"
    assert attrs(compaction)["durable_harness.outcome"] == "ok"
    (alone,) = [s for s in spans if s.parent is None and s is not run]
    assert alone.name == "chat scripted-1"
    assert attrs(alone)["durable_harness.purpose"] == "compaction"
    assert attrs(alone)["durable_harness.run.id"] == ""
    assert alone.context.trace_id != run.context.trace_id
    got = samples(metrics.render()[0])
    assert (
        value(got, "durable_harness_provider_requests_total", purpose="compaction", outcome="ok")
        == 2
    )
    assert value(got, "durable_harness_provider_requests_total", purpose="turn", outcome="ok") == 2


def test_a_run_is_the_root_of_its_trace_whatever_span_is_current(
    exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = HostTracer(provider)
    with provider.get_tracer("test").start_as_current_span("POST /sessions/s/agent/send"):
        tracer.observe("s", {"type": "run_start", "lane": "main", "runId": "r"})
    tracer.observe("s", {"type": "run_end", "lane": "main", "runId": "r", "outcome": "completed"})
    request, run = sorted(exporter.get_finished_spans(), key=lambda s: s.name)
    assert run.name == "durable_harness.run" and run.parent is None
    assert run.context.trace_id != request.context.trace_id
