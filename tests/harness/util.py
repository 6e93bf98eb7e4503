"""Helpers shared by the harness tests: sessions, a deterministic test tool, record readers,
(the write-ahead check, ``assert_intent_durable``, lives in :mod:`durable_harness.testing`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
from pydantic import BaseModel

from durable_harness.harness.core import Event
from durable_harness.harness.harness import Harness
from durable_harness.providers.base import ProviderEvent, ProviderRequest, TextDelta
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import Store
from durable_harness.tools.base import Replay, Tool, ToolContext, ToolResult


class EchoArgs(BaseModel):
    text: str


class EchoTool(Tool):
    """``echo``: returns its text at once (no await, so completion order is call order)."""

    name: ClassVar[str] = "echo"
    description: ClassVar[str] = "Echo the text back."
    Args: ClassVar[type[BaseModel]] = EchoArgs
    replay: ClassVar[Replay] = "safe"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        assert isinstance(args, EchoArgs)
        self.calls.append(ctx.tool_call_id)
        return ToolResult.text(f"echo: {args.text}")


def new_session(store: Store, cwd: Path) -> Session:
    """Create a fresh writable session in ``store`` for ``cwd``."""
    return Session(store.create_session(str(cwd)))


def records(session: Session, lane: str | None = "main") -> list[dict[str, Any]]:
    """Every record of ``lane`` (all lanes for ``None``), in seq order."""
    return session.store.records(lane)


def types_of(recs: list[dict[str, Any]]) -> list[str]:
    return [str(r["type"]) for r in recs]


def of_type(recs: list[dict[str, Any]], rtype: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["type"] == rtype]


def messages_on_path(session: Session, lane: str = "main") -> list[dict[str, Any]]:
    """The ``message`` entries on the lane's path, root first."""
    return [e for e in session.path(session.leaf(lane)) if e["type"] == "message"]


def collect_events(harness: Harness) -> tuple[list[Event], Callable[[], None]]:
    """Subscribe to ``harness``; return the (growing) event list and the unsubscribe function."""
    events: list[Event] = []
    return events, harness.subscribe(events.append)


def one_result_per_call(messages: list[dict[str, Any]]) -> None:
    """Assert that every tool call in ``messages`` has exactly one result, right after it."""
    calls = [
        b["id"]
        for m in messages
        if m.get("role") == "assistant"
        for b in m.get("content") or []
        if isinstance(b, dict) and b.get("type") == "toolCall"
    ]
    results = [m["toolCallId"] for m in messages if m.get("role") == "toolResult"]
    assert sorted(calls) == sorted(results), (calls, results)
    assert len(set(results)) == len(results), results


def commit_groups(session: Session) -> dict[int, int] | None:
    """For a JSONL session, map every seq to the file line (commit) holding it; ``None`` for
    other backends."""
    location = session.store.location
    if location.startswith("sqlite:"):
        return None
    import orjson

    out: dict[int, int] = {}
    with open(location, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1 or not raw.strip():
                continue
            for op in orjson.loads(raw)["ops"]:
                body = op.get("entry") or op.get("record") or op
                out[int(body["seq"])] = number
    return out


def assert_same_commit(session: Session, *seqs: int) -> None:
    """Assert the seqs are consecutive and (for JSONL) stored on one line: one commit."""
    ordered = sorted(seqs)
    assert ordered == list(range(ordered[0], ordered[0] + len(ordered))), ordered
    lines = commit_groups(session)
    if lines is not None:
        assert len({lines[s] for s in seqs}) == 1, {s: lines[s] for s in seqs}


class GatedProvider(ScriptedProvider):
    """A scripted provider whose turns wait for the test instead of a timer.

    Each turn (of ``only_prompts`` if given, else every turn) streams its first ``stall_after``
    text chunks, sets :attr:`stalled`, then waits for :attr:`release` (forever if the test
    never sets it: an abort or cancellation ends it). Once released, no turn waits again. A test
    then knows the run is still open, mid-stream, however slow the machine is.
    """

    def __init__(
        self,
        turns: list[dict[str, Any]],
        *,
        stall_after: int = 0,
        only_prompts: set[str] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(turns, **kw)
        self.stall_after = stall_after
        self.only_prompts = only_prompts
        self.stalled = anyio.Event()
        self.release = anyio.Event()

    async def _gate(self) -> None:
        if not self.release.is_set():
            self.stalled.set()
            await self.release.wait()

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Play the turn as :class:`ScriptedProvider` does, waiting at the gate (above)."""
        gated = request.purpose == "turn" and (
            self.only_prompts is None or request.prompt in self.only_prompts
        )
        chunks = 0
        if gated and self.stall_after == 0:
            await self._gate()
        async for event in super().stream(request):
            yield event
            if gated and isinstance(event, TextDelta):
                chunks += 1
                if chunks == self.stall_after:
                    await self._gate()

    async def wait_stalled(self, within: float = 20.0) -> None:
        """Wait (at most ``within`` seconds, a generous deadline) until a turn is at the gate."""
        with anyio.fail_after(within):
            await self.stalled.wait()
