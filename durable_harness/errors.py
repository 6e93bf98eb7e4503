"""Typed errors of durable-harness, each with a stable ``code``: the class name in snake_case
(``SessionNotFound`` is ``session_not_found``) unless the class sets its own. The tree and
its codes: ``design/api.md`` "Errors". Provider messages pass through :func:`redact`; OS and
database errors become storage errors in :mod:`durable_harness.storage.oserrors`
(``design/cli.md``).
"""

from __future__ import annotations

import re
from typing import Any

from durable_harness.models import snake_case


class DurableHarnessError(Exception):
    """Base of every error this library raises on purpose.

    Attributes:
        code: a stable machine-readable string (see the module docstring).
        details: JSON-serialisable extra facts (ids, paths, offsets).
    """

    code = "error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            cls.code = snake_case(cls.__name__)

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """Return ``{"code", "message", **details}`` for the CLI (the store's owner)."""
        return {"code": self.code, "message": self.message, **self.details}

    def to_remote_json(self) -> dict[str, Any]:
        """What a remote front (HTTP, console, ACP) shows a caller: :meth:`to_json`, less
        what a subclass keeps local (an ambiguous prefix's other session ids)."""
        return self.to_json()


class StorageError(DurableHarnessError):
    """A store could not do what was asked."""

    code = "storage"


class StorageIOError(StorageError):
    """The operating system or the database refused a read or write of a store: a full disk,
    a read-only or unreadable file or folder, an I/O error.

    It keeps the parent's code ``storage``; ``details`` hold ``path`` (the file, or the store's
    location), ``errno`` (the symbolic name, e.g. ``ENOSPC``; the SQLite result code's name for
    a database error) and ``cause`` (the system's text, e.g. ``No space left on device``).
    """

    code = "storage"


class DatabaseLocked(StorageError):
    """Another connection held a SQLite database's lock for longer than the busy timeout
    (``details``: ``path``, ``timeout_s``)."""


class StoreNotFound(StorageError):
    """A command that only reads named a store that does not exist (nothing is created)."""


class SessionNotFound(StorageError):
    """No session has this id, id prefix or path."""


class AmbiguousSessionPrefix(StorageError):
    """A session id prefix matches more than one session; ``details['candidates']`` lists them."""

    def to_remote_json(self) -> dict[str, Any]:
        """The prefix and how many sessions it matches, without their ids: a caller who
        names one session learns nothing of the others."""
        ref = str(self.details.get("ref", ""))[:200]
        count = len(self.details.get("candidates", ()))
        return {
            "code": self.code,
            "message": f"session prefix {ref!r} matches {count} sessions; give more of the id",
            "ref": ref,
            "count": count,
        }


class SessionUnreadable(StorageIOError):
    """A session file, a folder of them or a store's database exists but cannot be read
    (permissions, an I/O error, a directory where a file should be). ``details`` has ``path``
    and ``errno`` (the symbolic name, e.g. ``EACCES``)."""


class SessionExists(StorageError):
    """A session file or row with this id already exists; it is never overwritten."""


class LeaseHeld(StorageError):
    """Another live process holds the session's writer lease (``details['holder_pid']``)."""


class StaleGeneration(StorageError):
    """This writer's lease generation was superseded; its append was refused."""


class ReadOnlySession(StorageError):
    """A write was attempted on a session opened read-only."""

    code = "read_only"


class SessionClosed(StorageError):
    """A write was attempted on a session store after its ``close()``."""


class CorruptSession(StorageError):
    """Stored state that a single writer cannot produce (reported, never repaired silently)."""


class InvalidOp(StorageError):
    """A commit op with a field of the wrong type: stored, it would read back as damage."""


class NotASession(StorageError):
    """A file given as a session is not one: neither a durable-harness session file (its first
    line a session header or a commit line) nor a pi session file."""


class NotAStore(StorageError):
    """A folder or database given as a store is not one: no ``sessions/`` folder and no session
    file below it, or a SQLite database without the ``sessions`` table."""


class IdConflict(CorruptSession):
    """A provisioned id already holds different content."""


class UnknownEntry(StorageError):
    """No entry with this id exists in the session."""


class UnknownLane(StorageError):
    """A session has no lane of this name; ``details['lanes']`` lists the lanes it has."""


class FormatError(DurableHarnessError):
    """Input that does not follow a documented format (scripted provider file, pi file...)."""


class ImportSpecError(FormatError):
    """A ``"module:function"`` import path (a scenario's ``tools`` or ``provider``) cannot be
    loaded, or the function returned the wrong kind of object; ``details['spec']`` names it."""

    code = "import_spec"


class RunError(DurableHarnessError):
    """A run-loop operation was refused."""


class RunInProgress(RunError):
    """A run is already open on this lane (at most one per lane)."""


class NoOpenRun(RunError):
    """The operation needs an open run on the lane and there is none."""


class LaneSuspended(RunError):
    """The lane is suspended (crash or awaiting a decision); recover or resume it first."""


class AttemptCapReached(RunError):
    """A provider request hit the durable attempt cap (attempts counted across restarts)."""


class ToolProcessRunning(RunError):
    """A process group recorded for an unsettled tool call is still running, so its effect may
    still land (``details``: ``session_id``, ``pgids``; ``design/recovery.md``)."""


class ProviderError(DurableHarnessError):
    """A provider request failed; ``retryable`` says whether a retry may succeed."""

    def __init__(
        self, message: str, *, retryable: bool = False, status: int | None = None, **details: Any
    ) -> None:
        super().__init__(redact(message), status=status, retryable=retryable, **details)
        self.retryable = retryable
        self.status = status


class MissingCredential(ProviderError):
    """A provider needs an API key and its environment variable (``details['env']``) is unset
    or empty. Raised before anything is written."""

    def __init__(self, message: str, *, env: str, **details: Any) -> None:
        super().__init__(message, retryable=False, env=env, **details)


class ToolError(DurableHarnessError):
    """A tool was misused (bad arguments, unknown tool)."""


class PathEscape(ToolError):
    """A tool path resolves outside the session's working directory."""


class McpConfigError(ToolError):
    """An MCP servers config (``{"mcpServers": {...}}``, ``design/mcp.md``) is unreadable or
    malformed (``details``: ``path``, and ``server`` when one server's entry is at fault)."""


class McpServerUnavailable(ToolError):
    """An MCP server could not be started or reached, or went away (``details``: ``server``);
    its calls get this as an error result, the run goes on (``design/mcp.md``)."""


class RecoveryError(DurableHarnessError):
    """Recovery could not proceed."""


class AlreadyDecided(RecoveryError):
    """A decision was given for a call attempt that already has one on record; it is never
    replaced (``design/recovery.md``, "Attempts"). Nothing was written. ``details``:
    ``session_id``, ``tool_call_id``, ``call_key``, ``lane``, ``run_id``, ``attempt``,
    ``on_record`` (``{"decision", "result"?, "seq"}``) and ``given`` (the refused decision)."""


class ToolProcessElsewhere(RecoveryError):
    """A ``retry`` of a call whose recorded process group was started on another machine, where
    it may still run (``details``: ``session_id``, ``tool_call_id``, ``host``, ``pid``); kill it
    there, or force it (``retry!``, ``design/recovery.md``, "Process groups left running")."""


class HostError(DurableHarnessError):
    """The host (``durable_harness.host``, ``design/host.md``) refused a lifecycle request."""


class InvalidRequest(HostError):
    """A request's input is malformed: an empty message, a working directory that is not a
    directory, a malformed session id, an unknown mode. Nothing was changed."""


class CwdNotAllowed(HostError):
    """A session's working directory (real path) is outside every ``HostOptions.roots`` tree
    (``details``: ``cwd``, ``real``, ``roots``). Nothing was created."""


class MessageTooLarge(HostError):
    """A message is over the host's limit (``details['limit']`` bytes). Nothing was changed."""


class IllegalTransition(HostError):
    """A session's lifecycle state cannot move as asked (``details['from']``, ``['to']``):
    the one table of legal moves is ``durable_harness.host.lifecycle.TRANSITIONS``."""


class SessionLive(HostError):
    """The session has a live runtime generation (here, or in another process holding its
    writer lease), so it cannot be resumed again or forgotten; close it first."""


class SessionNotLive(HostError):
    """The session has no live runtime generation (it is closed, suspended or in error), so it
    cannot take input; resume it first."""


class IdempotencyKeyReused(HostError):
    """An ``Idempotency-Key`` seen before came with a different request (``details``: ``key``,
    ``fields`` that differ; ``design/http.md``)."""


def root_cause(exc: BaseException) -> BaseException:
    """Reduce an exception group (a task group's wrapper, nested or not) to the exception that
    caused it: of its leaves, the first :class:`DurableHarnessError`, else the first ``OSError``
    or ``sqlite3.Error``, else the first other ``Exception``, else the first leaf. Any other
    exception is returned as is."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves: list[BaseException] = []
    stack: list[BaseException] = [exc]
    while stack:
        item = stack.pop()
        if isinstance(item, BaseExceptionGroup):
            stack.extend(reversed(item.exceptions))
        else:
            leaves.append(item)
    import sqlite3

    for wanted in (DurableHarnessError, (OSError, sqlite3.Error), Exception):
        for leaf in leaves:
            if isinstance(leaf, wanted):
                return leaf
    return leaves[0] if leaves else exc


_SECRET = re.compile(
    r"(sk-[A-Za-z0-9_\-]{6,}|(?i:bearer)\s+[A-Za-z0-9._\-]{6,}|x-api-key[:=]\s*\S+)"
)


def redact(text: str) -> str:
    """Replace anything shaped like an API key or bearer token with ``[redacted]``."""
    return _SECRET.sub("[redacted]", text)


def encodable(value: Any) -> Any:
    """``value`` (an error body: strings, lists, dicts, scalars) with every string made
    encodable as UTF-8: a lone surrogate such as ``\\ud800`` becomes its ``\\uXXXX`` escape, so
    rendering an error that quotes hostile input never fails (``design/http.md``, "Errors")."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    return value
