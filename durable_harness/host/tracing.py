"""OpenTelemetry spans of a host's runs, built from harness events (``design/observability.md``
shows the span tree and attributes). Needs the ``otel`` extra; without it :class:`HostTracer`
is a no-op (:attr:`HostTracer.enabled` is False).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durable_harness.harness.core import Event
from durable_harness.host.metrics import request_key, usage_counts

_log = logging.getLogger(__name__)

try:
    from opentelemetry import trace as _otel_trace
    from opentelemetry.context import Context as _Context
except ImportError:  # without the otel extra (tests load the module so too)
    _otel_trace = None  # type: ignore[assignment]
    _ROOT = None
else:
    _ROOT = _Context()
    """The empty context: a run's span roots its own trace (the run outlives its request)."""

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

INSTRUMENTATION = "durable_harness.host"
"""The instrumentation scope name of every span."""

_RUN_EVENTS = ("suspended", "tool_process_killed", "queue_update")
"""Events recorded as span events on their run's span."""

# fmt: off
_TRACED = frozenset({
    "run_start", "run_end", "turn_start", "turn_end", "provider_request_start",
    "provider_request_end", "tool_execution_start", "tool_execution_end", *_RUN_EVENTS,
})
# fmt: on

_USAGE_ATTRS = {
    "output": "gen_ai.usage.output_tokens",
    "cacheRead": "gen_ai.usage.cache_read.input_tokens",
    "cacheWrite": "gen_ai.usage.cache_creation.input_tokens",
}
INPUT_TOKENS = "gen_ai.usage.input_tokens"
"""All the input tokens, cached ones included, as the GenAI conventions count them: a usage's
``input`` (the tokens not read from or written to a cache) + ``cacheRead`` + ``cacheWrite``."""

FINISH_REASONS = {"stop": "stop", "length": "length", "toolUse": "tool_call", "error": "error"}
"""A message's ``stopReason`` in the GenAI conventions' finish reason values; another one
(``aborted``) is kept as it is."""


def finish_reason(stop_reason: str) -> str:
    """The GenAI finish reason of a ``stopReason`` (:data:`FINISH_REASONS`)."""
    return FINISH_REASONS.get(stop_reason, stop_reason)


def usage_attributes(counts: dict[str, int]) -> dict[str, int]:
    """The ``gen_ai.usage.*`` attributes of token ``counts`` (``input``, ``output``,
    ``cacheRead``, ``cacheWrite``; :data:`INPUT_TOKENS` sums the inputs)."""
    attrs = {_USAGE_ATTRS[k]: v for k, v in counts.items() if k in _USAGE_ATTRS}
    inputs = [counts[k] for k in ("input", "cacheRead", "cacheWrite") if k in counts]
    if inputs:
        attrs[INPUT_TOKENS] = sum(inputs)
    return attrs


def available() -> bool:
    """True when ``opentelemetry`` is importable (the ``otel`` extra is installed)."""
    return _otel_trace is not None


class _Run:
    """The open spans of one run."""

    __slots__ = ("children", "span", "turn", "usage")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.turn: Span | None = None
        self.children: dict[str, Span] = {}  # provider requests and tool calls, by key
        self.usage: dict[str, int] = {}


class HostTracer:
    """Turns the harness events of many sessions into OpenTelemetry spans, keyed by session
    and run id; fed like :class:`~durable_harness.host.metrics.HostMetrics`.
    :meth:`observe` never raises (a broken event is logged and skipped).

    Args:
        tracer_provider: where spans go; default the global provider.
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], _Run] = {}
        self._orphans: dict[tuple[str, str, str], Span] = {}  # requests outside runs
        self._tracer: Any = None
        if _otel_trace is not None:
            from durable_harness import __version__

            provider = tracer_provider or _otel_trace.get_tracer_provider()
            self._tracer = provider.get_tracer(INSTRUMENTATION, __version__)

    @property
    def enabled(self) -> bool:
        """True when spans are made (``opentelemetry`` is importable)."""
        return self._tracer is not None

    def listener(self, session_id: str) -> Callable[[Event], None]:
        """A ``Harness.subscribe`` callback tracing that harness's events as ``session_id``."""
        return lambda event: self.observe(session_id, event)

    def observe(self, session_id: str, event: Event) -> None:
        """Start, annotate or end the span an event of session ``session_id`` belongs to.
        Never raises; a no-op without OpenTelemetry."""
        if self._tracer is None or event.get("type") not in _TRACED:
            return
        try:
            with self._lock:
                self._observe(session_id, event)
        except Exception:  # a tracing bug must not break the run that emitted the event
            _log.exception("tracing: cannot trace event %r of session %s", event, session_id)

    def forget_session(self, session_id: str) -> None:
        """End every span still open for ``session_id`` (``durable_harness.ended_by=forget``)."""
        with self._lock:
            for key in [k for k in self._runs if k[0] == session_id]:
                self._end_run(self._runs.pop(key), "forget")
            for orphan in [k for k in self._orphans if k[0] == session_id]:
                self._orphans.pop(orphan).end()

    def close(self) -> None:
        """End every open span (host shutdown: ``durable_harness.ended_by=shutdown``)."""
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
            for run in runs:
                self._end_run(run, "shutdown")
            orphans, self._orphans = list(self._orphans.values()), {}
            for span in orphans:
                span.end()

    # -- the event -> span mapping (called under the lock) ------------------------------------

    def _observe(self, sid: str, event: Event) -> None:
        assert _otel_trace is not None
        etype = event.get("type")
        run_id = str(event.get("runId") or "")
        lane = str(event.get("lane", "main"))
        if not run_id:  # outside runs: a compaction or branch summary, a trace of its own
            orphan = (sid, lane, request_key(event))
            if etype == "provider_request_start":
                self._orphans[orphan] = self._start_request(None, sid, event)
            elif etype == "provider_request_end" and orphan in self._orphans:
                self._end_request(self._orphans.pop(orphan), event)
            return
        key = (sid, run_id)
        run = self._runs.get(key)
        if etype == "run_start":
            if run is not None:  # a second start for a run still open: end the first one
                self._end_run(self._runs.pop(key), "restart")
            span = self._tracer.start_span(
                "durable_harness.run",
                context=_ROOT,
                attributes={
                    "durable_harness.session.id": sid,
                    "durable_harness.lane": lane,
                    "durable_harness.run.id": run_id,
                    "gen_ai.conversation.id": sid,
                },
            )
            self._runs[key] = _Run(span)
        elif etype == "run_end":
            if run is None:
                return
            del self._runs[key]
            outcome = str(event.get("outcome", "unknown"))
            awaiting = [str(a) for a in event.get("awaiting") or []]
            run.span.set_attribute("durable_harness.outcome", outcome)
            if awaiting:
                run.span.set_attribute("durable_harness.run.awaiting", awaiting)
            run.span.set_attributes(usage_attributes(run.usage))
            if outcome == "failed":
                run.span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, "run failed"))
            self._end_run(run, None)
        elif run is None:
            return  # an event of a run that started before this tracer listened
        elif etype == "turn_start":
            if run.turn is not None:
                run.turn.end()
            run.turn = self._tracer.start_span(
                "durable_harness.turn",
                context=_otel_trace.set_span_in_context(run.span),
                attributes={
                    "durable_harness.session.id": sid,
                    "durable_harness.run.id": run_id,
                    "durable_harness.turn": int(event.get("turn", 0)),
                },
            )
        elif etype == "turn_end":
            if run.turn is not None:
                run.turn.end()
                run.turn = None
        elif etype == "provider_request_start":
            run.children[request_key(event)] = self._start_request(run, sid, event)
        elif etype == "provider_request_end":
            span = run.children.pop(request_key(event), None)
            if span is not None:
                self._end_request(span, event)
            for field, count in usage_counts(event).items():
                run.usage[field] = run.usage.get(field, 0) + count
        elif etype == "tool_execution_start":
            call_id = str(event.get("toolCallId"))
            run.children["tool:" + call_id] = self._start_tool(run, sid, event)
        elif etype == "tool_execution_end":
            call_id = str(event.get("toolCallId"))
            span = run.children.pop("tool:" + call_id, None)
            if span is None:  # settled without running: a span of zero length, now
                span = self._start_tool(run, sid, event)
            outcome = str(event.get("outcome", "unknown"))
            span.set_attribute("durable_harness.outcome", outcome)
            if event.get("isError"):
                span.set_attribute("error.type", outcome)
                span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, outcome))
            span.end()
        elif etype in _RUN_EVENTS:
            attrs = {
                k: v if isinstance(v, str | int | float | bool) else [str(x) for x in v]
                for k, v in event.items()
                if k not in ("type", "lane", "runId") and isinstance(v, str | int | float | list)
            }
            run.span.add_event(str(etype), attributes=attrs)

    def _start_request(self, run: _Run | None, sid: str, event: Event) -> Span:
        assert _otel_trace is not None
        parent = run.turn or run.span if run is not None else None
        model = str(event.get("model") or "")
        return self._tracer.start_span(  # type: ignore[no-any-return]
            f"chat {model}".strip(),
            context=_otel_trace.set_span_in_context(parent) if parent is not None else _ROOT,
            kind=_otel_trace.SpanKind.CLIENT,
            attributes={
                "durable_harness.session.id": sid,
                "durable_harness.run.id": str(event.get("runId") or ""),
                "durable_harness.purpose": str(event.get("purpose", "turn")),
                "durable_harness.turn": int(event.get("turn", 0)),
                "durable_harness.attempt": int(event.get("attempt", 0)),
                "gen_ai.operation.name": "chat",
                "gen_ai.conversation.id": sid,
                "gen_ai.provider.name": str(event.get("provider") or ""),
                "gen_ai.request.model": model,
            },
        )

    def _end_request(self, span: Span, event: Event) -> None:
        assert _otel_trace is not None
        outcome = str(event.get("outcome", "unknown"))
        span.set_attribute("durable_harness.outcome", outcome)
        span.set_attributes(usage_attributes(usage_counts(event)))
        if event.get("stopReason"):
            reason = finish_reason(str(event["stopReason"]))
            span.set_attribute("gen_ai.response.finish_reasons", [reason])
        if outcome == "error":
            span.set_attribute("error.type", str(event.get("status") or "provider_error"))
            span.set_status(
                _otel_trace.Status(_otel_trace.StatusCode.ERROR, str(event.get("error", "")))
            )
        span.end()

    def _start_tool(self, run: _Run, sid: str, event: Event) -> Span:
        assert _otel_trace is not None
        tool = str(event.get("toolName") or "")
        return self._tracer.start_span(  # type: ignore[no-any-return]
            f"execute_tool {tool}".strip(),
            context=_otel_trace.set_span_in_context(run.turn or run.span),
            kind=_otel_trace.SpanKind.INTERNAL,
            attributes={
                "durable_harness.session.id": sid,
                "durable_harness.run.id": str(event.get("runId") or ""),
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.conversation.id": sid,
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": str(event.get("toolCallId") or ""),
            },
        )

    def _end_run(self, run: _Run, ended_by: str | None) -> None:
        """End a run's open children, its turn, then the run."""
        for span in run.children.values():
            span.set_attribute("durable_harness.ended_by", ended_by or "run_end")
            span.end()
        run.children.clear()
        if run.turn is not None:
            run.turn.end()
            run.turn = None
        if ended_by is not None:
            run.span.set_attribute("durable_harness.ended_by", ended_by)
        run.span.end()


__all__ = [
    "FINISH_REASONS",
    "INPUT_TOKENS",
    "INSTRUMENTATION",
    "HostTracer",
    "available",
    "finish_reason",
    "usage_attributes",
]
