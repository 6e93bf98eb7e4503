"""The ACP agent: Agent Client Protocol requests as verbs of the host's session manager
(``design/acp.md``, "Methods"). Each session has one channel (its updates in order, sent by
one task); a response or a question waits until the channel has sent what came before it."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
from acp import PROTOCOL_VERSION, RequestError, update_agent_message_text
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AudioContentBlock,
    ClientCapabilities,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
)
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from durable_harness import __version__
from durable_harness.acp.errors import CONFLICT, INTERNAL, INVALID_PARAMS, rpc_error
from durable_harness.acp.mcp import SessionMcp
from durable_harness.acp.runtime import ToolRuntime, question
from durable_harness.acp.updates import EventTranslator, Update, recovery_plan, replay
from durable_harness.errors import DurableHarnessError, NoOpenRun, SessionLive, SessionNotLive
from durable_harness.harness.core import Event
from durable_harness.host.manager import SessionManager
from durable_harness.host.options import HostOptions
from durable_harness.host.record import SessionRecord
from durable_harness.recovery.decide import ToolCallPlan

log = logging.getLogger(__name__)

PromptBlock = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)

SKIPPED_RESULT = (
    "Skipped after a crash: this call was started, its outcome is unknown, and the user chose "
    "not to run it again. Check its effect before relying on it."
)
"""The result (not an error) an in-doubt call settles with when the client answers "skip"."""

IN_DOUBT_OPTIONS = [
    PermissionOption(option_id="retry", name="Run it again", kind="allow_once"),
    PermissionOption(option_id="fail", name="Mark it failed", kind="reject_once"),
    PermissionOption(option_id="skip", name="Skip it (outcome unknown)", kind="reject_once"),
]
"""The question for an in-doubt call after a crash (answers: :data:`IN_DOUBT_DECISIONS`)."""

IN_DOUBT_DECISIONS: dict[str, dict[str, Any]] = {
    "retry": {"decision": "retry"},
    "fail": {"decision": "fail"},
    "skip": {"decision": "result", "result": SKIPPED_RESULT},
}

MAX_REPLAY_ENTRIES = 1_000_000

CREATE_WAIT_S = 30.0
"""How long closing waits for a ``session/new`` still being handled (seconds)."""


@dataclass
class _RunEnd:
    """A run's end as the channel delivered it."""

    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: str | None = None
    stop_reason: str | None = None
    lane: str = "main"


@dataclass
class _Channel:
    """A session's ordered outbox: harness events, ready updates and flush markers."""

    send: MemoryObjectSendStream[tuple[str, Any]]
    receive: MemoryObjectReceiveStream[tuple[str, Any]]
    cwd: str = ""


def prompt_text(blocks: list[PromptBlock]) -> str:
    """A prompt's content as one user message's text (``design/acp.md``, "Methods").

    Raises:
        RequestError: an image, audio or binary resource (not advertised).
    """
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(
            block.resource, TextResourceContents
        ):
            parts.append(f"{block.resource.uri}:\n{block.resource.text}")
        else:
            raise RequestError(
                INVALID_PARAMS,
                f"a {block.type} block is not supported: this agent takes text, resource "
                "links and embedded text resources",
                {"code": "invalid_request", "blockType": block.type},
            )
    return "\n\n".join(parts)


def _not_live(session_id: str, state: str, why: str) -> RequestError:
    return rpc_error(
        SessionNotLive(f"session {session_id} {why}", session_id=session_id, state=state)
    )


class DurableAgent:
    """An ACP agent over a :class:`~durable_harness.host.SessionManager`, its tools run through
    :attr:`runtime`: build it, wrap the tools (:func:`acp_options`), :meth:`bind` it."""

    def __init__(self) -> None:
        self.manager: SessionManager | None = None
        self.client: Client | None = None
        self.runtime = ToolRuntime(self)
        self.mcp = SessionMcp()  # the MCP servers of session/new and session/load
        self._tg: anyio.abc.TaskGroup | None = None
        self._channels: dict[str, _Channel] = {}
        self._ends: dict[str, _RunEnd] = {}  # run id -> its end
        self._live: set[str] = set()  # sessions with a generation started by this agent
        self._creating: set[anyio.Event] = set()  # session/new requests being handled
        self._send_failed = False
        self.output_open: Callable[[], bool] = lambda: True  # set by acp.serve

    def bind(self, manager: SessionManager, tg: anyio.abc.TaskGroup) -> None:
        """Attach the manager (its events flow to the channels) and the senders' task group."""
        self.manager = self.runtime.manager = manager
        self._tg = tg
        manager.observe(self._observe)

    def on_connect(self, conn: Client) -> None:
        """The SDK hands over the client side of the connection."""
        self.client = self.runtime.client = conn

    def _manager(self) -> SessionManager:
        if self.manager is None:
            raise RuntimeError("DurableAgent.bind() was not called")
        return self.manager

    def _channel(self, session_id: str) -> _Channel:
        chan = self._channels.get(session_id)
        if chan is None:
            send, receive = anyio.create_memory_object_stream[tuple[str, Any]](math.inf)
            chan = _Channel(send, receive)
            self._channels[session_id] = chan
            assert self._tg is not None
            self._tg.start_soon(self._drain, session_id, chan)
        return chan

    def _observe(self, session_id: str, event: Event) -> None:
        if event.get("type") == "run_start" and event.get("runId"):
            self.runtime.run_sessions[str(event["runId"])] = session_id
        self._channel(session_id).send.send_nowait(("event", event))

    def push(self, session_id: str, update: Update) -> None:
        """Queue ``update`` after what the session's channel holds."""
        self._channel(session_id).send.send_nowait(("update", update))

    async def flush(self, session_id: str) -> None:
        """Wait until the session's channel has sent everything queued before this call."""
        marker = anyio.Event()
        self._channel(session_id).send.send_nowait(("flush", marker))
        await marker.wait()

    def _end(self, run_id: str) -> _RunEnd:
        return self._ends.setdefault(run_id, _RunEnd())

    async def _drain(self, session_id: str, chan: _Channel) -> None:
        """Send the session's updates in order (one task per session)."""
        translator = EventTranslator("", lambda call_id: self._result_of(session_id, call_id))
        async with chan.receive:
            async for kind, item in chan.receive:
                if kind == "flush":
                    item.set()
                    continue
                if kind == "update":
                    await self._send(session_id, item)
                    continue
                if not translator.cwd:
                    translator.cwd = chan.cwd or await self._cwd(session_id)
                for update in translator.feed(item):
                    await self._send(session_id, update)
                if item.get("type") == "run_end" and item.get("runId"):
                    run_id = str(item["runId"])
                    end = self._end(run_id)
                    end.outcome = str(item.get("outcome"))
                    end.stop_reason = translator.stop_reasons.pop(run_id, None)
                    end.lane = str(item.get("lane", "main"))
                    end.done.set()

    async def _cwd(self, session_id: str) -> str:
        try:
            return (await self._manager().get(session_id)).cwd
        except DurableHarnessError:
            return ""

    async def _send(self, session_id: str, update: Update) -> None:
        if self.client is None:
            return
        try:
            await self.client.session_update(session_id=session_id, update=update)
        except (ConnectionError, RequestError) as exc:
            if not self._send_failed:  # once: a client gone fails every update after it
                log.warning("session/update to the client failed: %s", exc)
            self._send_failed = isinstance(exc, ConnectionError)

    def _result_of(self, session_id: str, tool_call_id: str) -> dict[str, Any] | None:
        """The ``toolResult`` message of a call, from the end of the transcript."""
        try:
            page = self._manager().messages(session_id, limit=MAX_REPLAY_ENTRIES)
        except DurableHarnessError:
            return None
        for entry in reversed(page["entries"]):
            message = entry.get("message") if entry.get("type") == "message" else None
            if (
                isinstance(message, dict)
                and message.get("role") == "toolResult"
                and message.get("toolCallId") == tool_call_id
            ):
                return message
        return None

    async def _get(self, session_id: str) -> SessionRecord:
        try:
            return await self._manager().get(session_id)
        except DurableHarnessError as exc:
            raise rpc_error(exc) from exc

    async def _check_live(self, session_id: str) -> None:
        """Refuse a session this agent does not run: unknown (``-32002``), or not loaded."""
        rec = await self._get(session_id)
        if session_id not in self._live:
            why = f"is {rec.state} and not loaded in this agent: send session/load first"
            raise _not_live(session_id, rec.state, why)

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        """Agree on the protocol version (``1``) and keep the client's capabilities."""
        if client_capabilities is not None:
            self.runtime.capabilities = client_capabilities
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(embedded_context=True),
            ),
            agent_info=Implementation(name="durable-harness", version=__version__),
        )

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[Any] | None = None,
        **kwargs: Any,
    ) -> NewSessionResponse:
        """A new durable session in ``cwd`` (its id is the ACP session id), with the tools of
        ``mcp_servers`` (:mod:`durable_harness.acp.mcp`); a client that goes away meanwhile
        does not cut it short (:meth:`close_all`)."""
        done = anyio.Event()
        self._creating.add(done)
        try:
            servers = await self.mcp.open(self._tg, mcp_servers)
            async with self.mcp.starting(servers):
                rec = await self._manager().create(cwd)
            self._live.add(rec.id)
        except DurableHarnessError as exc:
            raise rpc_error(exc) from exc
        finally:
            self._creating.discard(done)
            done.set()
        self._channel(rec.id).cwd = rec.cwd
        if not self.output_open():
            log.warning(
                "session %s was created for a session/new whose client has gone (stdout "
                "closed): it cannot be told, and the session is closed",
                rec.id,
            )
        return NewSessionResponse(session_id=rec.id)

    async def prompt(
        self, session_id: str, prompt: list[PromptBlock], **kwargs: Any
    ) -> PromptResponse:
        """Start a durable run with the prompt, stream its updates, return its stop reason."""
        text = prompt_text(prompt)
        await self._check_live(session_id)
        try:
            accepted = await self._manager().send(session_id, text, mode="prompt")
        except DurableHarnessError as exc:
            raise rpc_error(exc) from exc
        run_id = str(accepted["run_id"])
        end = self._end(run_id)
        await end.done.wait()
        self._ends.pop(run_id, None)
        return PromptResponse(stop_reason=self.stop_reason(session_id, run_id, end))

    def stop_reason(
        self, session_id: str, run_id: str, end: _RunEnd
    ) -> Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]:
        """A run's outcome as an ACP stop reason (``design/acp.md``, "Stop reasons").

        Raises:
            RequestError: a run that failed otherwise (``-32603``, ``run_failed``), or that
                suspended waiting for a decision (``-32010``, ``suspended``).
        """
        outcome = end.outcome
        if outcome == "completed":
            return "max_tokens" if end.stop_reason == "length" else "end_turn"
        if outcome == "aborted":
            return "cancelled"
        if outcome == "declined":
            return "refusal"
        if outcome == "failed":
            finished = self._finished(session_id, end.lane, run_id)
            if finished.get("limit") == "max_turns":
                return "max_turn_requests"
            reason = str(finished.get("reason") or "no reason recorded")
            raise RequestError(
                INTERNAL,
                f"run {run_id} failed: {reason}",
                {"code": "run_failed", "runId": run_id, "reason": reason},
            )
        raise RequestError(
            CONFLICT,
            f"run {run_id} is suspended, waiting for a decision on an in-doubt tool call; "
            "send session/load to decide it",
            {"code": "suspended", "runId": run_id},
        )

    def _finished(self, session_id: str, lane: str, run_id: str) -> dict[str, Any]:
        """The run's ``run_finished`` record (``{}`` when there is none)."""
        page = self._manager().log(session_id, lane=lane, limit=MAX_REPLAY_ENTRIES)
        for rec in reversed(page["records"]):
            if rec.get("type") == "run_finished" and rec.get("runId") == run_id:
                return dict(rec)
        return {}

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """Abort the session's running turn (durably); nothing to do when no run is open."""
        try:
            await self._manager().abort(session_id)
        except (NoOpenRun, SessionNotLive, SessionLive):
            return
        except DurableHarnessError as exc:
            log.warning("session/cancel of %s: %s", session_id, exc.message)

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None,
        **kwargs: Any,
    ) -> LoadSessionResponse:
        """Replay the transcript, then resume the session (``design/acp.md``, "Methods")."""
        manager = self._manager()
        rec = await self._get(session_id)
        self._channel(session_id).cwd = rec.cwd
        entries = manager.messages(session_id, limit=MAX_REPLAY_ENTRIES)["entries"]
        for update in replay(rec.cwd, entries):
            self.push(session_id, update)
        await self.flush(session_id)
        if session_id in self._live:
            return LoadSessionResponse()
        plan = manager.plan(session_id) if rec.state == "suspended" else None
        lanes = [lp for lp in (plan.lanes if plan else []) if lp.run_id is not None]
        decisions: dict[str, dict[str, Any]] = {}
        if lanes:
            self.push(session_id, recovery_plan(lanes, "pending"))
            for lp in lanes:
                what = f"Run {lp.run_id} on lane {lp.lane} was interrupted"
                action = lp.next_action.replace("_", " ")
                self.push(
                    session_id, update_agent_message_text(f"{what}; resuming it ({action}).\n")
                )
            await self.flush(session_id)
            for lp in lanes:
                for call in lp.waiting():
                    answer = await self._ask_in_doubt(session_id, call)
                    if answer is None:
                        waiting = [c.tool_call_id for lane in lanes for c in lane.waiting()]
                        return LoadSessionResponse(
                            field_meta={"durableHarness": {"awaiting": waiting}}
                        )
                    decisions[call.tool_call_id] = {**answer, "author": "acp"}
                    if answer["decision"] == "retry":
                        self.runtime.approved.add((session_id, call.tool_call_id))
        ends = {str(lp.run_id): self._end(str(lp.run_id)) for lp in lanes}
        try:
            servers = await self.mcp.open(self._tg, mcp_servers)
            async with self.mcp.starting(servers):
                resumed = await manager.resume(session_id, decisions or None)
        except DurableHarnessError as exc:  # e.g. already_decided: nothing was written
            self.runtime.approved -= {(session_id, call_id) for call_id in decisions}
            raise rpc_error(exc) from exc
        if resumed.state not in ("idle", "running"):
            why = f"did not resume: it is {resumed.state}"
            why += f" ({resumed.last_error})" if resumed.last_error else ""
            raise _not_live(session_id, resumed.state, why)
        self._live.add(session_id)
        recovered = []
        for run_id, end in ends.items():
            await end.done.wait()
            self._ends.pop(run_id, None)
            try:
                stop: str = self.stop_reason(session_id, run_id, end)
            except RequestError as exc:  # the error's data.code
                stop = str((exc.data if isinstance(exc.data, dict) else {}).get("code", "error"))
            recovered.append(
                dict(runId=run_id, lane=end.lane, outcome=end.outcome, stopReason=stop)
            )
        if lanes:
            self.push(session_id, recovery_plan(lanes, "completed"))
            await self.flush(session_id)
        meta = {"durableHarness": {"recovered": recovered}} if recovered else None
        return LoadSessionResponse(field_meta=meta)

    async def _ask_in_doubt(self, session_id: str, call: ToolCallPlan) -> dict[str, Any] | None:
        """Put an in-doubt call to the client; its answer as a decision (``None``: cancelled)."""
        asked = question(
            call.tool_call_id,
            call.tool_name,
            call.arguments or {},
            " (interrupted: outcome unknown)",
            inDoubt=True,
            doubt=call.doubt,
        )
        answer = await self.runtime.ask(session_id, asked, IN_DOUBT_OPTIONS)
        return IN_DOUBT_DECISIONS.get(answer or "")

    async def close_all(self, reason: str = "the client went away") -> None:
        """Close every session this agent runs, once each ``session/new`` being handled ends."""
        manager = self._manager()
        with anyio.move_on_after(CREATE_WAIT_S):
            for done in list(self._creating):
                await done.wait()
        if self._live:  # named: one created as the client left may never have been told
            ids = ", ".join(sorted(self._live))
            log.warning("%s: closing %d session(s): %s", reason, len(self._live), ids)
        for session_id in sorted(self._live):
            try:
                await manager.close(session_id)
            except DurableHarnessError as exc:
                log.warning("closing %s: %s", session_id, exc.message)
        self._live.clear()


def acp_options(options: HostOptions, agent: DurableAgent) -> HostOptions:
    """The host options of an ACP agent: tools wrapped, no session resumed at start-up."""
    return dataclasses.replace(
        options, tools=agent.runtime.tools(agent.mcp.compose(options.tools)), auto_resume="never"
    )
