"""``durable_harness/logs.py`` (the JSON and text formats, the format's choice) and
``durable_harness/telemetry.py`` (which exporters the ``OTEL_*`` environment asks for; the
recovery spans in an SDK provider): ``design/observability.md``."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from durable_harness import logs, telemetry
from durable_harness.errors import InvalidRequest


@pytest.fixture
def restore_logging() -> Iterator[None]:
    logger = logging.getLogger(logs.ROOT)
    level, propagate = logger.level, logger.propagate
    yield
    logs.unconfigure()  # what the CLI does at the end of a command
    assert not logs.json_enabled()
    assert (logger.level, logger.propagate) == (level, propagate)


def test_json_format_is_one_object_a_line_with_the_ids_first(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("json", stream)
    log = logging.getLogger("durable_harness.host.test")
    logs.event(
        log,
        "claim",
        "session %s: claimed",
        "s1",
        session_id="s1",
        generation=2,
        lane="main",
        run_id=None,  # None fields are left out
        lanes={"main": "retry_tool"},
    )
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("it failed")
    log.debug("not shown")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert list(first)[:8] == [
        "time",
        "level",
        "logger",
        "event",
        "message",
        "session_id",
        "generation",
        "lane",
    ]
    assert first["message"] == "session s1: claimed" and "run_id" not in first
    assert first["lanes"] == {"main": "retry_tool"} and first["level"] == "info"
    assert second["event"] == "log" and second["level"] == "error"
    assert "ValueError: boom" in second["exception"]
    assert logs.json_enabled()


def test_text_format_shows_warnings_and_announced_records_only(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("text", stream)
    log = logging.getLogger("durable_harness.host.test")
    logs.event(log, "lifecycle", "session s1: idle", session_id="s1")  # JSON only
    logs.event(log, "claim", "session %s: claimed", "s2", announce=True, session_id="s2")
    logs.event(log, "resume_failed", "it failed", level=logging.WARNING, generation=3)
    assert stream.getvalue().splitlines() == [
        "durable-harness: session s2: claimed (session id s2)",
        "durable-harness: warning: it failed (generation 3)",
    ]
    assert not logs.json_enabled()


def test_the_format_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(logs.ENV, raising=False)
    assert logs.format_of(None) == "text"
    monkeypatch.setenv(logs.ENV, "json")
    assert logs.format_of(None) == "json"
    assert logs.format_of("text") == "text"
    monkeypatch.setenv(logs.ENV, "yaml")
    with pytest.raises(InvalidRequest, match="not a log format"):
        logs.format_of(None)


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, []),  # no variable: nothing exported (the SDK's own default would be otlp)
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console,otlp"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_exporters_the_environment_asks_for(env: dict[str, str], names: list[str]) -> None:
    assert telemetry.exporter_names(env) == names


def test_without_otel_env_the_cli_installs_no_provider() -> None:
    """In a fresh interpreter: ``run``'s start-up with no OTEL_* leaves the API's proxy
    provider in place (nothing is exported, no SDK is even imported)."""
    code = (
        "import argparse, sys\n"
        "from durable_harness.cli import observability\n"
        "observability.start(argparse.Namespace(command='run', log_format=None))\n"
        "from durable_harness import telemetry\n"
        "print(telemetry.installed(), 'opentelemetry.sdk.trace' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_recovery_spans_nest_under_the_plan() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # telemetry.span uses the global provider: patch the tracer lookup for this test only
    from opentelemetry import trace

    original = trace.get_tracer
    trace.get_tracer = lambda name, *a, **k: provider.get_tracer(name)  # type: ignore[assignment]
    try:
        with (
            telemetry.span("durable_harness.recovery.plan", policy="ask", skipped=None),
            telemetry.span("durable_harness.recovery.decision", calls=["a", "b"]),
        ):
            pass
        with pytest.raises(RuntimeError), telemetry.span("durable_harness.recovery.reconcile"):
            raise RuntimeError("hook broke")
    finally:
        trace.get_tracer = original  # type: ignore[assignment]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    plan, decision = (
        spans["durable_harness.recovery.plan"],
        spans["durable_harness.recovery.decision"],
    )
    assert decision.parent is not None and plan.context is not None
    assert decision.parent.span_id == plan.context.span_id
    assert dict(plan.attributes or {}) == {"policy": "ask"}
    assert dict(decision.attributes or {}) == {"calls": ("a", "b")}
    failed = spans["durable_harness.recovery.reconcile"]
    assert failed.status.status_code.name == "ERROR"
    assert failed.events[0].name == "exception"


def test_the_default_handler_writes_to_the_stderr_of_the_moment(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("json")  # made before the capture below replaced nothing: it looks each time
    logs.event(logging.getLogger("durable_harness.x"), "notice", "hello", announce=True)
    assert json.loads(capsys.readouterr().err)["message"] == "hello"
