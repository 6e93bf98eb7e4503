"""The CLI's logs and traces (``design/observability.md``): ``--log-format`` on every command,
and for the commands that run agents (``serve``, ``run``, ``resume``, ``acp``) the traces the
``OTEL_*`` environment asks for, through one :class:`~durable_harness.host.tracing.HostTracer`
per process."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from durable_harness import logs, telemetry

TRACED_COMMANDS = frozenset({"serve", "run", "resume", "acp"})
"""The commands that export traces when ``OTEL_*`` asks (the others run no agent)."""

log = logging.getLogger("durable_harness.cli")

_tracer: Any = None  # the process's HostTracer, once telemetry is installed


def log_format_option(p: argparse.ArgumentParser) -> None:
    """``--log-format text|json`` (every command)."""
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        help="how log records are printed on stderr: text (warnings, claims, resumes, "
        "decisions, kills) or json (one object per line, every lifecycle change too; default: "
        f"${logs.ENV}, else text)",
    )


def start(args: argparse.Namespace) -> None:
    """Configure the logs of the command ``args`` names, then, for :data:`TRACED_COMMANDS`,
    the traces of the environment (:func:`~durable_harness.telemetry.configure_from_env`).

    Raises:
        InvalidRequest: ``$DURABLE_HARNESS_LOG_FORMAT`` names no format.
    """
    logs.configure(logs.format_of(getattr(args, "log_format", None)))
    if getattr(args, "command", None) in TRACED_COMMANDS:
        telemetry.configure_from_env()


def observers() -> list[Callable[[str, dict[str, Any]], None]]:
    """The ``(session id, event)`` observers a host of this process gets: the process's
    :class:`~durable_harness.host.tracing.HostTracer` when traces are exported, else none."""
    tracer = _host_tracer()
    return [] if tracer is None else [tracer.observe]


def listeners(session_id: str) -> list[Callable[[dict[str, Any]], None]]:
    """The ``Harness.subscribe`` callbacks of a ``run`` or ``resume`` of ``session_id``:
    the tracer when traces are exported, and in the JSON log format the host's log of runs
    and suspensions (:class:`~durable_harness.host.logbook.HostLog`)."""
    out: list[Callable[[dict[str, Any]], None]] = []
    tracer = _host_tracer()
    if tracer is not None:
        out.append(tracer.listener(session_id))
    if logs.json_enabled():
        from durable_harness.host.logbook import HostLog

        host_log = HostLog()
        out.append(lambda event: host_log.observe(session_id, event))
    return out


def as_record(name: str, message: str, **fields: Any) -> bool:
    """In the JSON log format, log ``message`` as event ``name`` with ``fields`` and return
    True (the command's status line on stderr becomes a record); else return False and
    the caller prints its line as it always has."""
    if not logs.json_enabled():
        return False
    logs.event(log, name, "%s", message, announce=True, **fields)
    return True


def _host_tracer() -> Any:
    global _tracer
    if _tracer is None and telemetry.installed():
        from durable_harness.host.tracing import HostTracer

        _tracer = HostTracer()
    return _tracer


def finish() -> None:
    """End the spans still open (a suspended ``run``, a ``serve`` stopped), flush the
    exporters and remove the log handler: the command is over. Never raises."""
    global _tracer
    tracer, _tracer = _tracer, None
    try:
        if tracer is not None:
            tracer.close()
        telemetry.shutdown()
    except Exception:  # an exporter that cannot flush must not change the exit status
        log.exception("flushing the traces failed")
    finally:
        logs.unconfigure()


def announce(message: str, *args: object, **fields: Any) -> None:
    """Tell the operator ``message % args`` on stderr: a line of the text format, or a JSON
    record (event ``notice``) of the JSON one."""
    logs.event(log, "notice", message, *args, announce=True, **fields)


__all__ = [
    "TRACED_COMMANDS",
    "announce",
    "as_record",
    "finish",
    "listeners",
    "log_format_option",
    "observers",
    "start",
]
