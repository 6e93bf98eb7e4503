"""The session record: a session's durable facts, derived from what the session itself
stores (``design/host.md``, "Two objects").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, cast

from durable_harness.harness.records import record
from durable_harness.host.lifecycle import State, reconciled
from durable_harness.models.records import CommandRuntime as CommandRuntime
from durable_harness.storage.base import Durability, SessionStore


@dataclass
class SessionRecord:
    """A session's durable facts (never a task, socket, lock or client).

    Attributes:
        id: the session id (UUIDv7 for sessions created here).
        cwd: the working directory its tools run in (absolute).
        mode: the durability mode of its commits (``sync``, ``batch``, ``none``).
        store: the store spec (``jsonl:DIR``, ``sqlite:PATH``).
        transcript: where its tree and logs live (a file path or ``sqlite:PATH#id``).
        generation: the fencing generation that last wrote a lifecycle record (0: none).
        state: the lifecycle state (:data:`~durable_harness.host.lifecycle.State`).
        last_error: why the last generation failed, or ``None``.
        command_runtime: ``pipe`` or ``pty``, re-chosen from here on every resume.
        provider: the provider spec new runs use (``None``: the host's default).
        client_key: the ``Idempotency-Key`` the session was created with, if any.
        allowed_tools: the tools allowed to run without asking, sorted.
    """

    id: str
    cwd: str
    mode: Durability = "sync"
    store: str = ""
    transcript: str = ""
    generation: int = 0
    state: State = "closed"
    last_error: str | None = None
    command_runtime: CommandRuntime = "pipe"
    provider: str | None = None
    client_key: str | None = None
    allowed_tools: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (the HTTP API's session resource)."""
        return asdict(self)


def read_record(store: SessionStore, spec: str, *, owner_alive: bool) -> SessionRecord:
    """Derive the :class:`SessionRecord` of an open session; ``owner_alive``: whether a live
    process holds the writer lease (when not, the state is :func:`reconciled`).

    Raises:
        StorageError: the session cannot be read.
    """
    last: dict[str, Any] | None = None
    key: str | None = None
    for rec in store.records("main", types=("session_lifecycle",)):
        last = rec
        if key is None and rec.get("clientKey"):
            key = str(rec["clientKey"])
    allowed = sorted(
        {
            str(rec.get("toolName"))
            for rec in store.records("main", types=("tool_permission",))
            if rec.get("permission") == "allow_always"
        }
    )
    open_run = any(lane.run_id is not None for lane in store.lanes().values())
    if last is None:
        stored: State = "running" if open_run else "closed"
    else:
        stored = cast(State, last.get("state", "closed"))
        if stored == "idle" and open_run:
            stored = "running"
    rec_fields = last or {}
    return SessionRecord(
        id=store.session_id,
        cwd=str(store.header.get("cwd") or ""),
        mode=cast(Durability, rec_fields.get("mode") or store.durability),
        store=spec,
        transcript=store.location,
        generation=int(rec_fields.get("generation") or 0),
        state=reconciled(stored, owner_alive),
        last_error=rec_fields.get("error"),
        command_runtime=cast(CommandRuntime, rec_fields.get("commandRuntime") or "pipe"),
        provider=rec_fields.get("providerSpec"),
        client_key=key,
        allowed_tools=allowed,
    )


def lifecycle_record(
    rec: SessionRecord, state: State, *, error: str | None = None, client_key: str | None = None
) -> dict[str, Any]:
    """The ``session_lifecycle`` record making ``state`` durable for ``rec``'s generation."""
    fields: dict[str, Any] = {
        "state": state,
        "generation": rec.generation,
        "mode": rec.mode,
        "commandRuntime": rec.command_runtime,
        "providerSpec": rec.provider,
    }
    if error is not None:
        fields["error"] = error
    if client_key is not None:
        fields["clientKey"] = client_key
    return record("session_lifecycle", "main", None, **fields)


def permission_record(tool_name: str) -> dict[str, Any]:
    """The ``tool_permission`` record letting ``tool_name`` run without asking from now on."""
    return record("tool_permission", "main", None, toolName=tool_name, permission="allow_always")
