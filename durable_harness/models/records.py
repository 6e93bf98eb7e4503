"""The operation-log record vocabulary, declared once: one :class:`~typing.TypedDict` per record
type, each field's meaning in the string literal under it. The record constructor, the shape
check (:func:`record_fields_error`) and the table in ``design/api.md`` "The record vocabulary"
derive from them. Every field is optional at read time (``total=False``); an undeclared
``type`` passes with its :class:`RecordEnvelope` alone.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, Required, get_args, get_type_hints

from typing_extensions import TypedDict, is_typeddict

from durable_harness.models import snake_case

Queue = Literal["steer", "follow_up", "next_run"]
"""The three input queues of a lane."""

Purpose = Literal["turn", "compaction", "branch_summary"]
"""What a provider request is for."""

RunLimit = Literal["max_turns", "max_tool_calls", "attempt_cap"]
"""The run limits that fail a run (``run_finished.limit``)."""

CommandRuntime = Literal["pipe", "pty"]
"""How the bash tool connects a command: ``pipe`` (stdin ``/dev/null``, stdout and stderr a
pipe) or ``pty`` (stdin, stdout and stderr a pseudo-terminal)."""

COMMAND_RUNTIMES: tuple[str, ...] = get_args(CommandRuntime)
"""The command runtimes, default first."""


class _Envelope(TypedDict, total=False):
    id: Required[str]
    """The record's own id: 16 lowercase hex characters (:func:`durable_harness.ids.new_id`)."""
    lane: str | None
    """The lane whose log holds the record (``"main"`` unless a lane was created)."""
    runId: str | None
    """The run the record belongs to: a UUIDv7 string; absent for records outside a run."""
    seq: int
    """Position in the session, strictly rising across all its ops; assigned by storage."""
    timestamp: str
    """When the record was built: UTC ISO 8601 with milliseconds (``2026-01-31T12:00:00.000Z``)."""


class RecordEnvelope(_Envelope, total=False):
    """The fields every record has, and the only ones storage checks (``design/storage.md``)."""

    type: Required[str]
    """The record type: one of :data:`RECORD_TYPES` (storage accepts any string)."""


class _Attempt(_Envelope, total=False):
    """The fields a provider attempt's intent and settlements share."""

    turn: int
    """Turn number in the run, from 1 (0 for a summary outside a run)."""
    attempt: int
    """Attempt number of this turn and purpose, from 1, counted across restarts."""
    purpose: Purpose
    """What the request is for; absent means ``"turn"``."""


class _Call(_Envelope, total=False):
    """The fields naming the tool call a record is about."""

    toolCallId: str
    """The tool call's id as the model gave it (made unique within its message)."""
    callKey: str
    """The call's identity in the run: ``"<assistant entry id>/<index>"``."""


class RunStarted(_Envelope, total=False):
    """A prompt was accepted and a run opened; committed with the prompt's user entry."""

    promptEntryId: str
    """Id of the user entry holding the prompt (committed in the same commit)."""
    prompt: dict[str, Any]
    """The accepted user message (pi message object: ``role``, ``content``, ``timestamp``)."""
    provider: str
    """Provider name of the harness that accepted the prompt (``anthropic``, ``scripted``...)."""
    model: str
    """Model id the run started with."""
    providerSpec: str | None
    """The provider spec (``PROVIDER:MODEL``) ``resume`` rebuilds the provider from, if known."""
    limits: dict[str, Any]
    """The run's bounds (counts): ``{"attemptCap", "maxTurns", "maxToolCalls"}``; kept on resume."""
    clientKey: str
    """The caller's idempotency key for this input (``Harness.accepted``)."""


class ProviderRequestStarted(_Attempt, total=False):
    """The intent of one provider attempt, durable before the request is sent."""

    responseEntryId: str
    """Entry id provisioned for the answer (16 hex characters)."""
    provider: str
    """Provider name."""
    model: str
    """Model id the request is sent to."""


class ProviderRequestFinished(_Attempt, total=False):
    """Settlement of a provider attempt that answered; committed with the answer's entry."""

    entryId: str
    """Id of the entry holding the answer (assistant message, compaction or branch summary)."""
    responseEntryId: str
    """For summaries: the provisioned id (equal to ``entryId``)."""
    usage: dict[str, Any] | None
    """The provider's pi ``usage`` object (token counts, ``cost`` in US dollars), or null."""
    stopReason: str | None
    """Why the model stopped (``stop``, ``toolUse``, ``length``, ``error``...)."""
    renamedToolCallIds: list[dict[str, Any]]
    """Tool-call ids made unique before storing: ``[{"index", "from", "to"}]``."""


class ProviderRequestFailed(_Attempt, total=False):
    """Settlement of a provider attempt that failed (or was aborted)."""

    error: str
    """The failure, in words (``"aborted"`` for an abort)."""
    status: int | None
    """HTTP status of the failure, when there was one."""
    retryable: bool
    """Whether the harness may try again."""
    reason: str
    """Why, when the provider classified the failure: ``stream_truncated`` (the stream ended,
    or its connection broke, before its end marker) or ``stream_idle_timeout`` (the stream went
    silent); absent otherwise."""
    costUnknown: bool
    """True when the attempt was cut off, so its cost is unknown."""


class McpIntent(TypedDict, total=False):
    """What a ``tool_started`` intent of an MCP tool records of it (``design/mcp.md``)."""

    server: str
    """The server's name in the config (``mcpServers`` key)."""
    serverInfo: dict[str, Any]
    """The server's identity from ``initialize`` (``{"name", "version"}``)."""
    transport: Literal["stdio", "http"]
    """How the server was reached."""
    tool: str
    """The tool's name on the server."""
    annotations: dict[str, Any] | None
    """The tool's MCP annotations as listed (``readOnlyHint``...), or null when it had none."""
    replaySource: Literal["annotation", "override"]
    """Where ``replay`` came from: the annotations, or the config's per-tool ``replay``."""


class ToolStarted(_Call, total=False):
    """The intent of one tool call, durable before the tool's effect begins."""

    toolName: str
    """Name of the tool."""
    arguments: dict[str, Any]
    """The effective arguments (JSON object)."""
    resultEntryId: str
    """Entry id provisioned for the result (16 hex characters)."""
    replay: Literal["safe", "never"]
    """The tool's declared replay rule at the time of the intent."""
    idempotencyKey: str
    """Key handed to the tool: ``"<run id>:<call key>"``."""
    attempt: int
    """Execution attempt of this call, from 1 (a decided retry adds one)."""
    mcp: McpIntent
    """For an MCP server's tool only (``design/mcp.md``): which server and tool it is."""


class ToolFinished(_Call, total=False):
    """Settlement of one tool call; committed with its result entry."""

    resultEntryId: str
    """Id of the result entry."""
    isError: bool
    """Whether the result is an error."""
    outcome: Literal[
        "ok",
        "error",
        "reconciled",
        "failed_by_policy",
        "decided_fail",
        "decided_result",
        "not_run",
        "aborted",
    ]
    """How the call was settled: ran (``ok``/``error``), established by ``reconcile``, failed by
    the recovery policy, by a decision, not run, or aborted."""


class ToolProcess(_Call, total=False):
    """A tool started a process group (written without its own fsync)."""

    pgid: int
    """Process group id."""
    startTime: int | None
    """The leader's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    host: str
    """The machine the group runs on (``socket.gethostname()``): only a host on that machine
    can signal it; elsewhere it is reported, never killed (``design/recovery.md``)."""


class ToolProcessKilled(_Call, total=False):
    """A recorded process group of an unsettled call was found alive and SIGKILLed."""

    pgid: int
    """The process group killed."""
    host: str
    """The machine it was killed on."""
    by: Literal["reconcile", "claim", "resume", "close", "operator"]
    """Who killed it: start-up reconciliation, a worker's claim, the harness before it settles
    or re-runs the call, a close, or the operator (``POST /sessions/{id}/agent/kill``)."""


class QueueEnqueued(_Envelope, total=False):
    """Receipt of a queued message, durable before ``steer``/``follow_up``/``next_run``
    returns."""

    queue: Queue
    """The queue."""
    itemId: str
    """The item's id (16 hex characters)."""
    message: dict[str, Any]
    """The full user message (pi message object)."""
    clientKey: str
    """The caller's idempotency key for this input."""


class QueueConsumed(_Envelope, total=False):
    """Queued items delivered into the tree (at a save point, or as a next run's prompt)."""

    queue: Queue
    """The queue the items came from."""
    itemIds: list[str]
    """Ids of the delivered items."""
    entryIds: list[str]
    """Ids of the entries they became (next-run prompts)."""


class QueueCancelled(_Envelope, total=False):
    """Steer and follow-up items dropped by an abort (handed back to the caller)."""

    itemIds: list[str]
    """Ids of the cancelled items."""


class WriteDeferred(_Envelope, total=False):
    """A setter called during a run: durable now, applied at the next save point."""

    write: dict[str, Any]
    """The entry to append (``model_change``, ``thinking_level_change``, ``session_info`` or
    ``label``, without id and parent)."""
    clientKey: str
    """The caller's idempotency key for this input."""


class SavePoint(_Envelope, total=False):
    """The checkpoint between turns: queued messages delivered and deferred writes applied, in
    one commit."""

    turn: int
    """The turn that just ended."""
    appliedWrites: list[str]
    """Ids of the ``write_deferred`` records applied."""
    deliveredEntries: list[str]
    """Ids of the entries the delivered queue items became."""


class AbortRequested(_Envelope, total=False):
    """Durable marker written before the abort signal is raised (no fields of its own)."""


class Decision(_Call, total=False):
    """A human's (or policy's) decision on an in-doubt tool call's attempt, durable before it
    acts; at most one per attempt, never replaced (``design/recovery.md``, "Attempts")."""

    attempt: int
    """The attempt it decides: the number of ``tool_started`` intents of the call when it was
    given (0: a call whose intent a damaged log may have lost). Absent in older logs (then it
    decides the call's current attempt)."""
    decision: Literal["retry", "fail", "result"]
    """Run it again, settle it as failed, or settle it with ``result``."""
    result: str | None
    """The result text for ``decision: "result"``."""
    force: bool
    """On a forced ``retry`` (``retry!``) of a call whose group may still run elsewhere."""
    author: str | None
    """Who decided: ``policy:timeout`` for the host's decision timeout (``design/notify.md``),
    else what the front that took the decision names (absent: not said)."""


class RunFinished(_Envelope, total=False):
    """The run settled."""

    outcome: Literal["completed", "aborted", "failed", "declined"]
    """How the run ended."""
    appliedWrites: list[str]
    """Ids of the ``write_deferred`` records applied when it settled."""
    reason: str | None
    """Why it failed, in words (attempt cap, run limit, provider error)."""
    limit: RunLimit | None
    """The limit that failed the run, when one did (the typed twin of ``reason``)."""


class SessionLifecycle(_Envelope, total=False):
    """The host moved the session's lifecycle state (``design/host.md``); written by the
    generation that holds the writer lease, in lane ``main``, outside any run."""

    state: Literal["idle", "closing", "closed", "error"]
    """The state entered (``running`` is not written: an open run in a lane log is that
    observation; ``creating`` and ``suspended`` hold no lease to write with)."""
    generation: int
    """The runtime generation (the writer lease's fencing generation) that wrote it."""
    error: str | None
    """For ``error``: why the generation failed to start or stopped, in words."""
    mode: Literal["sync", "batch", "none"]
    """The session's durability mode (``design/storage.md``)."""
    commandRuntime: CommandRuntime
    """How the bash tool runs commands: through pipes or a pseudo-terminal."""
    providerSpec: str | None
    """The provider spec new runs of this session use (``scripted:FILE``, ``openai:MODEL``)."""
    clientKey: str | None
    """On the first ``idle``: the ``Idempotency-Key`` the session was created with."""


class ToolPermission(_Envelope, total=False):
    """A client's standing permission for a tool of the session ("always allow", given over
    ACP: ``design/acp.md``); in lane ``main``, outside any run."""

    toolName: str
    """The tool the permission is for (``bash``, ``write_file``...)."""
    permission: Literal["allow_always"]
    """What was granted: every later call of the tool runs without asking."""


#: Every record type, by its ``type`` value (the class name in snake case), in module order.
DECLARATIONS: dict[str, type] = {
    snake_case(name): td
    for name, td in list(globals().items())
    if is_typeddict(td)
    and td.__module__ == __name__
    and name[0] != "_"
    and td is not RecordEnvelope
    and td is not McpIntent  # a field's shape, not a record type
}

#: The record types, as the ``type`` values (the keys of :data:`DECLARATIONS`).
RECORD_TYPES: tuple[str, ...] = tuple(DECLARATIONS)

#: The envelope's field names (storage's part of every record).
ENVELOPE_FIELDS: frozenset[str] = frozenset(get_type_hints(RecordEnvelope))


@functools.cache
def _validator(rtype: str) -> Any:
    """The compiled pydantic-core validator of a declaration, built on first use (pydantic is
    imported then: the command line starts without it)."""
    from pydantic import TypeAdapter

    return TypeAdapter(DECLARATIONS[rtype]).validator


def record_fields_error(rec: dict[str, Any]) -> str | None:
    """Why ``rec`` does not match the declaration of its ``type`` (strictly: ``"1"`` is no
    integer), or ``None`` (also for an undeclared type). Fields not declared are allowed."""
    rtype = rec.get("type")
    if not isinstance(rtype, str) or rtype not in DECLARATIONS:
        return None
    try:
        _validator(rtype).validate_python(rec, strict=True)
    except ValueError as exc:  # pydantic_core.ValidationError
        errors = getattr(exc, "errors", None)
        if not callable(errors):
            raise
        err = errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "record"
        return f"{rtype} record: {where}: {err['msg']}"
    return None
