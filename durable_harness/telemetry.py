"""OpenTelemetry from the standard environment variables, and the recovery steps' spans
(``design/observability.md``, "Traces from the environment").

:func:`configure_from_env` is what ``serve``, ``run``, ``resume`` and ``acp`` call: when
``OTEL_TRACES_EXPORTER`` (or an ``OTEL_EXPORTER_OTLP_*ENDPOINT``) asks for traces, it installs
an SDK tracer provider whose resource, batching and exporter settings the SDK itself reads from
``OTEL_*`` (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``, the OTLP
exporter's endpoint, headers, timeout...). Without those variables, or without the ``otel``
extra, nothing is installed and nothing is exported.

:func:`span` wraps a recovery step (plan, reconcile, decision) in a span of the global
tracer provider; without OpenTelemetry it is a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from durable_harness import logs

log = logging.getLogger("durable_harness.telemetry")

SCOPE = "durable_harness.recovery"
"""The instrumentation scope of the recovery spans."""

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_installed: Any = None  # the SDK TracerProvider configure_from_env installed, if any


def exporter_names(env: Mapping[str, str] | None = None) -> list[str]:
    """The span exporters the environment asks for: ``OTEL_TRACES_EXPORTER`` split on
    commas (``none`` drops everything), else ``["otlp"]`` when an OTLP endpoint variable is
    set, else none. ``OTEL_SDK_DISABLED=true`` gives none. Unlike the SDK's auto-configuration
    (whose default is ``otlp``), no variable means no export: a CLI run must not try to reach
    a collector nobody asked for."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    given = env.get("OTEL_TRACES_EXPORTER")
    if given is None:
        return ["otlp"] if any(env.get(name) for name in _ENDPOINTS) else []
    names = [n.strip().lower() for n in given.split(",") if n.strip()]
    return [] if "none" in names else list(dict.fromkeys(names))


def _exporter_class(name: str) -> Any:
    """The exporter class registered under ``name`` in the ``opentelemetry_traces_exporter``
    entry points (the SDK's own registry: ``console``, ``otlp_proto_http``, ...); ``otlp``
    is the HTTP/protobuf exporter of the ``otel`` extra unless
    ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` asks for ``grpc``."""
    if name == "otlp":
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        name = "otlp_proto_grpc" if protocol.strip() == "grpc" else "otlp_proto_http"
    from importlib.metadata import entry_points  # only when traces are asked for

    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    for ep in found:
        return ep.load()
    raise LookupError(name)


def configure_from_env() -> bool:
    """Install an SDK tracer provider as the global one when the environment asks for traces
    (:func:`exporter_names`), one batch span processor per exporter; idempotent. Returns
    whether spans are now exported. An exporter that cannot be loaded (its package missing,
    an unknown name) is logged as a warning and skipped: telemetry never stops a command."""
    global _installed
    if _installed is not None:
        return True
    names = exporter_names()
    if not names:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logs.event(
            log,
            "telemetry_unavailable",
            "OTEL_* asks for traces but OpenTelemetry is not installed: "
            "pip install 'durable-harness[otel]'",
            level=logging.WARNING,
        )
        return False
    from durable_harness import __version__

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; a service the
    # environment does not name is durable-harness (the SDK would say unknown_service)
    resource = Resource.create({"service.version": __version__})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "durable-harness"}))
    provider = TracerProvider(resource=resource)  # reads OTEL_TRACES_SAMPLER and the limits
    exporting = False
    for name in names:
        try:
            exporter = _exporter_class(name)()
        except Exception as exc:  # a missing package, an unknown name, a bad setting
            logs.event(
                log,
                "telemetry_exporter_skipped",
                "trace exporter %r skipped: %s",
                name,
                exc if not isinstance(exc, LookupError) else "not installed or unknown",
                level=logging.WARNING,
                exporter=name,
            )
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))  # reads OTEL_BSP_*
        exporting = True
    if not exporting:
        return False
    trace.set_tracer_provider(provider)
    _installed = provider
    return True


def shutdown() -> None:
    """Flush and shut down the provider :func:`configure_from_env` installed (the end of a
    command: a short ``run`` exports its spans before the process exits)."""
    global _installed
    provider, _installed = _installed, None
    if provider is not None:
        provider.shutdown()


def installed() -> bool:
    """Whether :func:`configure_from_env` installed a provider in this process."""
    return _installed is not None


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A span ``name`` of the global tracer provider (scope :data:`SCOPE`) around the block,
    made current so nested steps are its children; ``attributes`` with ``None`` values are
    left out, lists become lists of strings. An exception leaving the block is recorded and
    sets the status ``ERROR``. Yields the span (``None`` without OpenTelemetry)."""
    try:
        from opentelemetry import trace
    except ImportError:
        yield None
        return
    attrs = {k: _attribute(v) for k, v in attributes.items() if v is not None}
    with trace.get_tracer(SCOPE).start_as_current_span(name, attributes=attrs) as current:
        yield current


def _attribute(value: Any) -> Any:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [str(v) for v in value]
    return str(value)


__all__ = [
    "SCOPE",
    "configure_from_env",
    "exporter_names",
    "installed",
    "shutdown",
    "span",
]
