"""Pydantic models of every request and response body of the HTTP API (``design/http.md``),
shaped as the manager's return values; request models forbid unknown fields (a misspelt
field is 400 ``invalid_request``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from durable_harness.host.inputs import LANE_PATTERN
from durable_harness.host.lifecycle import State
from durable_harness.host.options import SendMode
from durable_harness.models.records import CommandRuntime
from durable_harness.storage.base import Durability as Mode

LANE_FIELD = Field(
    default="main",
    pattern=f"^{LANE_PATTERN}$",
    description="the lane (default main): a letter or digit, then letters, digits, '.', '_', '-'",
)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_Request):
    """``POST /sessions``: a new session in ``cwd`` (an absolute path to an existing
    directory on the host)."""

    cwd: str = Field(description="absolute path of an existing directory on the host")
    mode: Mode | None = Field(default=None, description="durability mode (default: host's)")
    command_runtime: CommandRuntime = Field(default="pipe", description="how bash runs commands")
    provider: str | None = Field(
        default=None, description="provider spec (scripted:FILE, openai:MODEL...; default: host's)"
    )


class SendMessage(_Request):
    """``POST /sessions/{id}/agent/send``: ``prompt`` starts a run; ``steer`` and
    ``follow_up`` queue into the running one."""

    message: str = Field(description="the text (non-empty; at most 1 MiB of UTF-8)")
    mode: SendMode = "prompt"
    lane: str = LANE_FIELD


class AbortRun(_Request):
    """``POST /sessions/{id}/agent/abort`` (the body is optional)."""

    lane: str = LANE_FIELD


class Decide(_Request):
    """``POST /sessions/{id}/agent/decide``: settle one in-doubt tool call of a suspended
    session (``retry``, ``fail`` or ``result:TEXT``)."""

    tool_call_id: str = Field(min_length=1, max_length=256)
    decision: str = Field(
        min_length=1,
        description='"retry", "retry!" (forced: the call\'s group may still run on another '
        'machine), "fail", or "result:TEXT" (TEXT becomes the result)',
    )


class KillTool(_Request):
    """``POST /sessions/{id}/agent/kill``: SIGKILL one unsettled call's live process group,
    deciding nothing (``design/host.md``)."""

    tool_call_id: str = Field(min_length=1, max_length=256)


class Killed(BaseModel):
    """What a kill did: ``killed`` is false when the group had already ended (nothing
    recorded); else a ``tool_process_killed`` record is in the log."""

    tool_call_id: str
    pgid: int
    killed: bool


class Session(BaseModel):
    """A session record (``design/host.md``): durable facts, never process state."""

    id: str
    cwd: str
    mode: Mode
    store: str
    transcript: str
    generation: int = Field(description="the runtime generation (writer-lease generation)")
    state: State
    last_error: str | None
    command_runtime: CommandRuntime
    provider: str | None
    client_key: str | None


class Unreadable(BaseModel):
    """A session of the store that could not be read (listed, never hidden)."""

    id: str
    path: str | None = None
    error: Any = None


class WaitingCall(BaseModel):
    """An in-doubt tool call a suspended session waits on for a decision
    (``host/listing.waiting_calls``): arguments up to 1 KiB of JSON, else their digest."""

    lane: str
    run_id: str | None
    tool_name: str
    tool_call_id: str
    call_key: str
    attempt: int = Field(description="the call's attempt (tool_started intents) a decision decides")
    doubt: str | None
    why: str = Field(
        "",
        description="why it is in doubt, in plain words (recovery/explain.py why_in_doubt)",
    )
    arguments: dict[str, Any] | None = None
    arguments_digest: str | None = Field(None, description="sha256:HEX of the arguments' JSON")
    arguments_bytes: int | None = None


class ListedSession(Session):
    """A session of ``GET /sessions``: its record, and the calls it waits on (``[]`` unless
    it is suspended waiting for a decision)."""

    title: str | None = Field(
        None, description="its name, else its first prompt's first line (Session.title)"
    )
    waiting: list[WaitingCall]
    resume_pending: int | None = Field(
        None,
        description="its place in the host's start-up resume queue (1: the next to begin; "
        "runtime state), or null when no resume of it is queued",
    )


class SessionList(BaseModel):
    """``GET /sessions``: every readable session (of the ``state`` values asked for, if any),
    most recently modified first."""

    sessions: list[ListedSession]
    unreadable: list[Unreadable]
    resumes_pending: int = Field(
        0, description="sessions whose start-up resume is queued and not begun, over the host"
    )


class Lane(BaseModel):
    """One lane of a session: its leaf entry, its open run, whether it runs here now."""

    lane: str
    leaf: str | None
    run_id: str | None
    live: bool


class Status(BaseModel):
    """``GET .../agent/status``: the lifecycle ``state``, ``generation``, ``lanes`` and the
    recovery ``plan`` (``durable-harness recover --json``) when suspended, else null."""

    id: str
    state: State
    generation: int
    lanes: list[Lane]
    plan: dict[str, Any] | None
    port: int | None = Field(description="the generation's control port (runtime state)")
    last_error: str | None
    resume_pending: int | None = Field(
        None,
        description="its place in the host's start-up resume queue (1: next; runtime "
        "state), or null",
    )


class Accepted(BaseModel):
    """``POST .../agent/send``: the input is durable. A prompt gives the new ``run_id``, a
    steer or follow-up the queued ``item_id``; ``duplicate`` when the ``Idempotency-Key``
    was accepted before (nothing was sent twice)."""

    mode: str
    lane: str
    run_id: str | None = None
    item_id: str | None = None
    duplicate: bool = False


class Aborted(BaseModel):
    """``POST .../agent/abort``: the steer and follow-up messages handed back."""

    lane: str
    returned: list[Any]


class Messages(BaseModel):
    """``GET .../agent/messages``: a page of the lane's transcript (root to leaf)."""

    lane: str
    total: int
    offset: int
    limit: int
    entries: list[dict[str, Any]]


class Log(BaseModel):
    """``GET .../agent/log``: a page of the operation log; ``next_since_seq`` is the
    ``since_seq`` of the next page, null on the last one."""

    records: list[dict[str, Any]]
    next_since_seq: int | None


class Error(BaseModel):
    """Every error body: the library's stable ``code``, a message naming the cause, and the
    error's details (ids, limits, the validation problems)."""

    model_config = ConfigDict(extra="allow")

    code: str
    message: str
