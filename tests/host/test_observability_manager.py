"""Metrics and tracing plugged into a real ``SessionManager`` (``manager.observe``): the events
of every session's generation arrive as ``(session_id, event)``, lifecycle moves included."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable_harness.host import HostOptions, SessionManager
from durable_harness.host.metrics import HostMetrics
from durable_harness.host.tracing import HostTracer

from .obs_util import samples, value

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_two_sessions_counted_and_traced_through_the_manager(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    turns = [
        {
            "text": "Reading.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
        },
        {"text": "Done."},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns}))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = HostTracer(provider)
    spec = f"jsonl:{tmp_path / 'home'}"
    async with SessionManager(spec, HostOptions(provider=f"scripted:{script}")) as m:
        metrics = HostMetrics(refresh=lambda mm: mm.set_awaiting_counts(m.awaiting_decisions()))
        m.observe(metrics.observe)
        m.observe(tracer.observe)
        with metrics:
            ids = [(await m.create(str(work))).id for _ in range(2)]
            for sid in ids:
                await m.send(sid, "read the notes")
            deadline = time.monotonic() + 30
            while len([s for s in exporter.get_finished_spans() if s.parent is None]) < 2:
                assert time.monotonic() < deadline, "the two runs did not end"
                await anyio.sleep(0.01)
            got = samples(metrics.render()[0])
    assert value(got, "durable_harness_runs_total", outcome="completed") == 2
    assert value(got, "durable_harness_tool_calls_total", tool="read_file", outcome="ok") == 2
    assert value(got, "durable_harness_turns_total") == 4
    assert value(got, "durable_harness_commit_seconds_count") > 0
    assert value(got, "durable_harness_fsync_seconds_count") > 0
    assert value(got, "durable_harness_tool_calls_awaiting_decision") == 0
    runs = [s for s in exporter.get_finished_spans() if s.name == "durable_harness.run"]
    assert sorted(str((s.attributes or {})["durable_harness.session.id"]) for s in runs) == sorted(
        ids
    )
    for span in exporter.get_finished_spans():
        assert (span.attributes or {})["durable_harness.session.id"] in ids
