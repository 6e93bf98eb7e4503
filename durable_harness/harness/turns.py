"""Provider turns (attempts, retries, streaming) and the operations beside runs that also
ask the provider: compaction and branch summaries (``design/run-loop.md``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import tenacity

from durable_harness import crash
from durable_harness.errors import (
    AttemptCapReached,
    ProviderError,
)
from durable_harness.harness.core import HarnessCore, LiveRun
from durable_harness.harness.records import record
from durable_harness.harness.state import (
    RunState,
    attempt_key,
)
from durable_harness.ids import new_id, now_ms
from durable_harness.models.content import text_of, unique_tool_call_ids
from durable_harness.providers.base import (
    STREAM_TRUNCATED,
    Done,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
)
from durable_harness.session.context import estimate_tokens, is_empty_assistant
from durable_harness.storage.base import EntryOp, Op, RecordOp

_T = TypeVar("_T")


class Turns:
    """The harness's provider component: turns (attempts, retries, streaming), compaction and
    branch summaries, all under the intent and settlement rules.

    Args:
        core: the harness's shared :class:`~durable_harness.harness.core.HarnessCore`.
    """

    def __init__(self, core: HarnessCore) -> None:
        self.core = core

    # -- provider turns --------------------------------------------------------------------

    async def provider_turn(self, live: LiveRun) -> None:
        s = live.state
        turn = s.turns + 1
        key = attempt_key("turn", turn)
        response_id = self._provisioned(s.pending.response_entry_id if s.pending else None)
        self.core.emit("turn_start", live, turn=turn)
        await self._with_attempts(
            f"{key} of run {s.run_id}",
            lambda: s.attempts.get(key, 0),
            s.limits.attempt_cap,
            lambda: self._attempt(live, turn, response_id),
        )

    def _provisioned(self, entry_id: str | None) -> str:
        """The entry id a re-issued request's answer is stored under: the one its first
        attempt provisioned, unless that id is taken already (a damaged log that lost the
        settlement but kept the entry): then a fresh one, never an overwrite."""
        if entry_id is None or self.core.store.get_entry(entry_id) is not None:
            return new_id()
        return entry_id

    async def _with_attempts(
        self,
        what: str,
        used: Callable[[], int],
        cap: int,
        attempt: Callable[[], Awaitable[_T]],
    ) -> _T:
        """Run ``attempt`` until it succeeds, retrying retryable provider errors with
        exponential backoff (``retry_initial`` doubling up to ``retry_max`` seconds), never past
        ``cap`` attempts as counted by ``used()`` (the durable count: attempts lost in crashes
        count too).

        Raises:
            AttemptCapReached: the cap is reached (before an attempt, or after a failed one).
            ProviderError: a non-retryable failure.
        """
        if used() >= cap:
            raise AttemptCapReached(
                f"{what} used {used()} of {cap} provider attempts (attempt cap reached)",
                attempts=used(),
                cap=cap,
            )
        try:  # the common case: the first attempt succeeds, no retry machinery needed
            return await attempt()
        except ProviderError as exc:
            if not exc.retryable:
                raise
            if used() >= cap:
                raise _cap_reached(what, used(), cap, exc) from exc
        await anyio.sleep(self.core.options.retry_initial)
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(cap - used()),
            wait=tenacity.wait_exponential(
                multiplier=self.core.options.retry_initial, max=self.core.options.retry_max
            ),
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, ProviderError) and e.retryable
            ),
            sleep=anyio.sleep,
            reraise=True,
        )

        async def again() -> _T:  # a coroutine function, so tenacity awaits it
            return await attempt()

        try:
            return await retrying(again)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            raise _cap_reached(what, used(), cap, exc) from exc

    async def _attempt(self, live: LiveRun, turn: int, response_id: str) -> None:
        s = live.state
        ctx = self.core.session.context(lane=s.lane)
        request = ProviderRequest(
            messages=ctx.messages,
            tools=self.core.specs,
            model=self.core.model(s.lane, ctx),
            system_prompt=self.core.options.system_prompt,
            thinking_level=ctx.thinking_level,
            run_id=s.run_id,
            turn=turn,
            attempt=s.attempts.get(attempt_key("turn", turn), 0) + 1,
            prompt=s.prompt_text,
        )
        message = await self._request(s.lane, live, request, response_id)
        message, renamed = unique_tool_call_ids(message)
        entry = self.core.entry(s.lane, {"type": "message", "id": response_id, "message": message})
        finished = record(
            "provider_request_finished",
            s.lane,
            s.run_id,
            turn=turn,
            attempt=request.attempt,
            entryId=response_id,
            usage=message.get("usage"),
            stopReason=message.get("stopReason"),
        )
        if renamed:
            finished["renamedToolCallIds"] = renamed
        # An answer whose every call is replay-safe is held for the first intent: one commit.
        # Any other is written alone, so a damaged line never loses a replay-never call with
        # its intent ("Merged commits" in design/run-loop.md).
        hold = self._replay_safe_calls(message)
        ops: list[Op] = [EntryOp(entry, lane=s.lane), RecordOp(finished)]
        self.core.commit(ops, live, assistant=message, hold=hold)
        if not hold:
            crash.crash_point("after_assistant_entry")

    def _replay_safe_calls(self, message: dict[str, Any]) -> bool:
        """True when ``message`` asks for tool calls and each names a registered tool whose
        ``replay`` is ``"safe"``."""
        # one pass over the content, no lists (tool_call_blocks, inlined: once a turn)
        content = message.get("content")
        if not isinstance(content, list):
            return False
        tools = self.core.tools
        found = False
        for b in content:
            if isinstance(b, dict) and b.get("type") == "toolCall":
                n = b.get("name")
                if not (isinstance(n, str) and n in tools and tools[n].replay == "safe"):
                    return False
                found = True
        return found

    async def _request(
        self, lane: str, live: LiveRun | None, request: ProviderRequest, response_id: str
    ) -> dict[str, Any]:
        """One provider attempt (a turn's or a summary's) under the intent rules: its
        ``provider_request_started`` is durable before the request goes out, and a failure is
        recorded (``provider_request_failed``, shielded) before it propagates."""
        run_id = live.state.run_id if live else None
        if live is not None:
            # from this intent on, an abort keeps only what this request streams: never the
            # last answer's or a summary's text (an abort can land at the barrier below)
            live.streamed = []
        ident: dict[str, Any] = {"turn": request.turn, "attempt": request.attempt}
        if request.purpose != "turn":
            ident["purpose"] = request.purpose
        started = record(
            "provider_request_started",
            lane,
            run_id,
            **ident,
            responseEntryId=response_id,
            provider=self.core.provider.name,
            model=request.model,
        )
        self.core.commit([RecordOp(started)], live)
        await self.core.barrier()
        crash.crash_point("after_provider_request_started")
        try:
            return await self._stream(live or LiveRun(RunState("", lane)), request)
        except ProviderError as exc:
            with anyio.CancelScope(shield=True):
                failed = record(
                    "provider_request_failed", lane, run_id, **ident, **failure_fields(exc)
                )
                self.core.commit([RecordOp(failed)], live)
            raise

    async def _stream(self, live: LiveRun, request: ProviderRequest) -> dict[str, Any]:
        """Stream one provider attempt (its intent is durable already) between a
        ``provider_request_start`` and a ``provider_request_end`` event, for observers (the
        host's spans and metrics): the end event carries ``outcome`` (``ok``, ``error`` or
        ``cancelled``), and ``usage``/``stopReason`` or ``error``/``status``/``retryable``."""
        ident = dict(turn=request.turn, attempt=request.attempt, purpose=request.purpose)
        self.core.emit(
            "provider_request_start",
            live,
            **ident,
            provider=self.core.provider.name,
            model=request.model,
        )
        try:
            message = await self._play(live, request)
        except ProviderError as exc:
            live.streamed = []  # a failed attempt's text is no answer, not even an aborted one
            self.core.emit(
                "provider_request_end", live, **ident, outcome="error", **failure_fields(exc)
            )
            raise
        except anyio.get_cancelled_exc_class():
            self.core.emit("provider_request_end", live, **ident, outcome="cancelled")
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.core.emit("provider_request_end", live, **ident, outcome="error", error=error)
            raise
        self.core.emit(
            "provider_request_end",
            live,
            **ident,
            outcome="ok",
            usage=message.get("usage"),
            stopReason=message.get("stopReason"),
        )
        return message

    async def _play(self, live: LiveRun, request: ProviderRequest) -> dict[str, Any]:
        text: list[str] = []
        live.streamed = text
        first = True
        purpose = request.purpose
        self.core.emit("message_start", live, role="assistant", purpose=purpose)
        stream = self.core.provider.stream(request)
        async for event in stream:
            if first:
                crash.crash_point("mid_provider_stream")
                first = False
            if isinstance(event, TextDelta):
                text.append(event.text)
                self.core.emit("message_update", live, delta=event.text, purpose=purpose)
            elif isinstance(event, ThinkingDelta):
                self.core.emit("message_update", live, thinking=event.text)
            elif isinstance(event, ToolCallEvent):
                self.core.emit(
                    "message_update", live, toolCall={"id": event.id, "name": event.name}
                )
            elif isinstance(event, Done):
                message = dict(event.message)
                message.setdefault("timestamp", now_ms())
                stop = message.get("stopReason")
                if stop is not None and not isinstance(stop, str):
                    raise ProviderError(
                        f"provider {self.core.provider.name} returned a message whose "
                        f"stopReason is {type(stop).__name__}, not a string"
                    )
                if _is_empty(message):
                    raise ProviderError(
                        f"provider {self.core.provider.name} returned an empty message",
                        retryable=True,
                    )
                # Closed here, not left to the garbage collector: asyncio finalizes a dropped
                # async generator by scheduling a task through its self-pipe, every turn.
                await _close(stream)
                self.core.emit("message_end", live, message=message, purpose=purpose)
                return message
        raise ProviderError(
            f"provider {self.core.provider.name} ended its stream without a message",
            retryable=True,
            reason=STREAM_TRUNCATED,
        )

    # -- compaction and navigation ---------------------------------------------------------

    async def maybe_compact(self, live: LiveRun) -> None:
        ctx = self.core.session.context(lane=live.state.lane)
        limit = self.core.compaction.limit
        tokens = ctx.state.tokens if ctx.state else estimate_tokens(ctx.messages)
        if tokens > limit > 0:
            await self.compact(live.state.lane, live)

    async def _summarize(
        self, lane: str, messages: list[dict[str, Any]], purpose: str, live: LiveRun | None
    ) -> tuple[dict[str, Any], str, int]:
        """Ask the provider for a summary: a provider attempt like a turn's, under the same
        intent/settlement rules, numbered and counted against the attempt cap across restarts
        (in a run: per run and purpose, before turn n; outside runs: per lane and purpose since
        the last finished one). Returns ``(message, response id, attempt)``.

        Raises:
            AttemptCapReached: the cap is reached.
            ProviderError: a non-retryable failure.
        """
        if live is not None:
            s = live.state
            turn = s.turns + 1
            key = attempt_key(purpose, turn)
            cap = s.limits.attempt_cap
            reuse = s.pending is not None and s.pending.key == key
            op_id = self._provisioned(s.pending.response_entry_id if s.pending and reuse else None)

            def used() -> int:
                return s.attempts.get(key, 0)

            what = f"{key} of run {s.run_id}"
        else:
            turn, cap, op_id = 0, self.core.options.attempt_cap, new_id()
            lane_log = self.core.lane_log(lane)

            def used() -> int:
                return lane_log.summary_attempts.get(purpose, 0)

            what = f"{purpose} on lane {lane!r}"
        settled: list[int] = []

        async def attempt() -> dict[str, Any]:
            number = used() + 1
            request = ProviderRequest(
                messages=[*messages, _SUMMARY_INSTRUCTION],
                model=self.core.model(lane),
                run_id=live.state.run_id if live else "",
                purpose=purpose,
                turn=turn,
                attempt=number,
            )
            message = await self._request(lane, live, request, op_id)
            settled.append(number)
            return message

        message = await self._with_attempts(what, used, cap, attempt)
        return message, op_id, settled[-1]

    def _settle_summary(
        self,
        lane: str,
        entry: dict[str, Any],
        message: dict[str, Any],
        attempt: int,
        purpose: str,
        live: LiveRun | None,
    ) -> None:
        """Commit a compaction or branch-summary entry with the record settling its request."""
        run_id = live.state.run_id if live else None
        finished = record(
            "provider_request_finished",
            lane,
            run_id,
            turn=live.state.turns + 1 if live else 0,
            attempt=attempt,
            purpose=purpose,
            entryId=entry["id"],
            responseEntryId=entry["id"],
            usage=message.get("usage"),
            stopReason=message.get("stopReason"),
        )
        self.core.commit([EntryOp(entry, lane=lane), RecordOp(finished)], live)

    async def compact(self, lane: str, live: LiveRun | None) -> dict[str, Any]:
        """Compact the lane's context: summarize what comes before a cut that keeps about
        ``keep_recent_tokens`` of recent context, never inside a tool call's exchange (the cut
        is always at a user message). ``live``: the run compacting between its turns, or
        ``None`` outside runs. Returns the compaction entry.
        """
        ctx = self.core.session.context(lane=lane)
        cut = _cut_index(ctx.messages, ctx.entry_ids, self.core.compaction.keep_recent_tokens)
        first_kept = ctx.entry_ids[cut] if cut is not None else None
        summarized = ctx.messages[:cut] if cut is not None else ctx.messages
        message, op_id, attempt = await self._summarize(lane, summarized, "compaction", live)
        entry = self.core.entry(
            lane,
            {
                "type": "compaction",
                "id": op_id,
                "summary": text_of(message.get("content")),
                "firstKeptEntryId": first_kept,
                "tokensBefore": estimate_tokens(ctx.messages),
                "settings": {"model": ctx.model, "thinkingLevel": ctx.thinking_level},
            },
        )
        self._settle_summary(lane, entry, message, attempt, "compaction", live)
        await self.core.barrier()
        return entry

    async def navigate(
        self, target_id: str | None, *, lane: str = "main", summarize: bool = True
    ) -> dict[str, Any] | None:
        """The body of :meth:`Harness.navigate <durable_harness.harness.harness.Harness.
        navigate>` (its docstring says what it does and raises)."""
        self.core.check_idle(lane)
        if not summarize:
            self.core.session.navigate(target_id, lane=lane)
            return None
        if target_id is not None:
            self.core.session.entry(target_id)
        ctx = self.core.session.context(lane=lane)
        from_id = self.core.session.leaf(lane)
        message, op_id, attempt = await self._summarize(lane, ctx.messages, "branch_summary", None)
        summary = text_of(message.get("content"))
        entry = self.core.session.make_entry(
            {"type": "branch_summary", "id": op_id, "fromId": from_id or "", "summary": summary},
            parent_id=target_id,
        )
        self._settle_summary(lane, entry, message, attempt, "branch_summary", None)
        await self.core.barrier()
        return entry


_SUMMARY_INSTRUCTION = {
    "role": "user",
    "content": [
        {
            "type": "text",
            "text": (
                "Summarize the conversation above for a later continuation: goals, "
                "decisions, files touched, open work."
            ),
        }
    ],
}
"""The message a summary request ends with (after the context it summarizes)."""


def failure_fields(exc: ProviderError) -> dict[str, Any]:
    """The fields a failed provider attempt's ``provider_request_failed`` record (and its
    ``provider_request_end`` event) carry: ``error`` (the message), ``status``, ``retryable``,
    and ``reason`` when the provider classified the failure (``stream_truncated``,
    ``stream_idle_timeout``: :mod:`durable_harness.providers.failures`)."""
    fields: dict[str, Any] = {
        "error": exc.message,
        "status": exc.status,
        "retryable": exc.retryable,
    }
    reason = exc.details.get("reason")
    if isinstance(reason, str) and reason:
        fields["reason"] = reason
    return fields


def _cap_reached(what: str, used: int, cap: int, exc: ProviderError) -> AttemptCapReached:
    return AttemptCapReached(
        f"{what} used {used} of {cap} provider attempts (attempt cap reached); "
        f"last error: {exc.message}",
        attempts=used,
        cap=cap,
    )


async def _close(stream: Any) -> None:
    """Close a provider stream whose answer is in (an async generator's ``aclose``); an error
    while closing is not the answer's and does not fail the attempt."""
    close = getattr(stream, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception:  # the answer is complete; only its cleanup failed
        pass


def _is_empty(message: dict[str, Any]) -> bool:
    return is_empty_assistant(message.get("content"))


def _cut_index(
    messages: list[dict[str, Any]], entry_ids: list[str | None], keep_tokens: int
) -> int | None:
    """Index of the first kept message: the latest user message (with an entry id) such that
    the messages from it on fit in ``keep_tokens``. ``None``: keep nothing verbatim."""
    best = None
    for i in range(len(messages) - 1, 0, -1):
        if estimate_tokens(messages[i:]) > keep_tokens:
            break
        if messages[i].get("role") == "user" and entry_ids[i] is not None:
            best = i
    return best
