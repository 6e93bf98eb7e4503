"""Structured logs of the library and its fronts, in one place (``design/observability.md``,
"Logs"): :func:`event` writes a record with the fields a reader filters on (session id,
generation, lane, run id), :class:`JsonFormatter` renders one JSON object per line, and
:func:`configure` installs the one stderr handler a command uses (``--log-format`` or
``DURABLE_HARNESS_LOG_FORMAT``).

Built on the standard :mod:`logging` module: every module keeps its own
``logging.getLogger("durable_harness....")``, so an application embedding the library routes
these records through its own handlers, and nothing here is needed to read them.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import orjson

LogFormat = Literal["text", "json"]
"""How :func:`configure` prints records: ``text`` (one readable line) or ``json``."""

FORMATS: tuple[LogFormat, ...] = ("text", "json")
"""The accepted values of ``--log-format`` and ``DURABLE_HARNESS_LOG_FORMAT``."""

ENV = "DURABLE_HARNESS_LOG_FORMAT"
"""The environment variable naming the format when ``--log-format`` is not given."""

ROOT = "durable_harness"
"""The logger every record of the package goes through (its modules' loggers are children)."""

FIELDS = ("session_id", "generation", "lane", "run_id")
"""The identifying fields a record carries when it concerns a session (JSON keys as named)."""

_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
"""Attributes every ``LogRecord`` has: anything else on a record came from ``extra``."""

_HANDLER_MARK = "_durable_harness_handler"


def event(
    logger: logging.Logger,
    name: str,
    message: str,
    *args: object,
    level: int = logging.INFO,
    announce: bool = False,
    **fields: Any,
) -> None:
    """Log ``message % args`` as event ``name`` on ``logger``, with ``fields`` (JSON-able
    values; ``None`` ones are left out) as attributes of the record.

    ``announce``: show an INFO record in the text format too (a worker's claims and resumes:
    the operator of a host wants them); otherwise the text format shows warnings and errors
    only, and the JSON format every INFO record. Costs one level check when nothing listens.
    """
    if not logger.isEnabledFor(level):
        return
    extra = {k: v for k, v in fields.items() if v is not None}
    extra["event"] = name
    if announce:
        extra["announce"] = True
    logger.log(level, message, *args, extra=extra)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, milliseconds),
    ``level`` (lower case), ``logger``, ``event`` (``log`` for a record logged without
    :func:`event`), ``message``, then the record's fields (``session_id``, ``generation``,
    ``lane``, ``run_id`` first when present) and ``exception`` (the formatted traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (values that are not JSON become strings)."""
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", "log"),
            "message": record.getMessage(),
        }
        extras = {
            k: v
            for k, v in vars(record).items()
            if k not in _STANDARD and k not in ("event", "announce")
        }
        for key in FIELDS:
            if key in extras:
                out[key] = extras.pop(key)
        out.update(extras)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """``durable-harness: [level] message (session S, generation G, lane L, run R)``."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one readable line (its traceback, if any, after it)."""
        ids = [f"{k.replace('_', ' ')} {getattr(record, k)}" for k in FIELDS if hasattr(record, k)]
        where = f" ({', '.join(ids)})" if ids else ""
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = f"durable-harness: {level}{record.getMessage()}{where}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _TextShows(logging.Filter):
    """The text format's choice: warnings and up, and the INFO records marked ``announce``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or bool(getattr(record, "announce", False))


def format_of(flag: str | None) -> LogFormat:
    """The format a command uses: ``flag`` (``--log-format``) if given, else
    ``$DURABLE_HARNESS_LOG_FORMAT``, else ``text``.

    Raises:
        InvalidRequest: the environment names no format of :data:`FORMATS`.
    """
    chosen = flag or os.environ.get(ENV) or "text"
    if chosen not in FORMATS:
        from durable_harness.errors import InvalidRequest

        raise InvalidRequest(
            f"{ENV}={chosen!r} is not a log format (one of: {', '.join(FORMATS)})",
            value=chosen[:100],
        )
    return chosen


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler writing to whatever ``sys.stderr`` is at each record (a test's
    capture, a redirected stream), not the one of the moment it was made."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


_saved: list[tuple[int, bool]] = []  # the ROOT logger's level and propagation before configure


def configure(fmt: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    """Send the package's records to ``stream`` (default: the current stderr) in ``fmt``: the
    one handler of the :data:`ROOT` logger (a second call replaces the first's), which then
    stops propagating to the root logger so nothing prints twice; :func:`unconfigure` undoes
    it. Returns the handler."""
    logger = logging.getLogger(ROOT)
    if not _saved:
        _saved.append((logger.level, logger.propagate))
    for old in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(old)
    handler: logging.Handler = _StderrHandler() if stream is None else logging.StreamHandler(stream)
    setattr(handler, _HANDLER_MARK, True)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
        handler.addFilter(_TextShows())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


def unconfigure() -> None:
    """Remove the handler :func:`configure` installed and give the :data:`ROOT` logger back
    its level and propagation (the end of a CLI command run in-process, as tests do)."""
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(old)
    if _saved:
        level, propagate = _saved.pop()
        logger.setLevel(level)
        logger.propagate = propagate


def json_enabled() -> bool:
    """Whether :func:`configure` installed the JSON format (the CLI's error boundary then
    writes its error as a record, so that stderr stays one JSON object per line)."""
    return any(
        getattr(h, _HANDLER_MARK, False) and isinstance(h.formatter, JsonFormatter)
        for h in logging.getLogger(ROOT).handlers
    )


__all__ = [
    "ENV",
    "FIELDS",
    "FORMATS",
    "ROOT",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "configure",
    "event",
    "format_of",
    "json_enabled",
    "unconfigure",
]
