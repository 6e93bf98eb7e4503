"""Issue 20 through the run loop: a real run against the local OpenAI/Anthropic server whose first
stream is cut (no end marker, cut inside a tool call's arguments, connection reset, idle past the
timeout) records ``provider_request_failed`` with its reason, retries, and stores the retry's
answer alone; when every attempt is cut, the run fails at the durable attempt cap."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from providers.servers import FakeLLMServer, ToolCallSpec, Turn

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.anthropic_provider import AnthropicProvider
from durable_harness.providers.base import Done, Provider, ProviderEvent, ProviderRequest, TextDelta
from durable_harness.providers.openai_compat import OpenAIProvider
from durable_harness.storage import Store, open_store

from .util import EchoTool, messages_on_path, new_session, of_type

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PARTIAL = "PARTIAL-first-attempt"  # streamed in pieces of 4 characters
ANSWER = "The retried answer."
IDLE = 0.4  # seconds; the server stalls 5 s


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """One backend here: what is stored does not depend on it (the storage tests cover both)."""
    return open_store(f"sqlite:{tmp_path}/s.db")


def make_provider(kind: str, srv: FakeLLMServer) -> Provider:
    if kind == "openai":
        return OpenAIProvider(
            "gpt-test", base_url=srv.openai_base_url, api_key="k", timeout=10.0, idle_timeout=IDLE
        )
    return AnthropicProvider(
        "claude-test", base_url=srv.anthropic_base_url, api_key="k", timeout=10.0, idle_timeout=IDLE
    )


def cut_turn(kind: str, cut: str) -> Turn:
    """A first answer cut the way ``cut`` says (event counts: ``tests/providers/servers.py``)."""
    echo = [ToolCallSpec("call_cut_1", "echo", {"text": "PARTIAL-argument"})]
    anthropic = kind == "anthropic"
    return {
        "no_end_marker": Turn(text=PARTIAL, end_after=-1 if anthropic else 6),
        "in_tool_arguments": Turn(tool_calls=echo, end_after=4 if anthropic else 3),
        "reset": Turn(text=PARTIAL, reset_after=5 if anthropic else 4),
        "idle": Turn(text=PARTIAL, delay=5.0, delay_after=5 if anthropic else 4),
    }[cut]


REASONS = {
    "no_end_marker": "stream_truncated",
    "in_tool_arguments": "stream_truncated",
    "reset": "stream_truncated",
    "idle": "stream_idle_timeout",
}


def stored_bytes(store: Store, session_id: str) -> str:
    """Every entry and record of the session, as JSON text."""
    session = store.open_session(session_id, write=False)
    try:
        return json.dumps([session.iter_entries(), session.records(None)], default=str)
    finally:
        session.close()


@pytest.mark.parametrize("cut", list(REASONS))
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_cut_attempt_is_retried_and_the_retry_stored_alone(
    kind: str, cut: str, store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    llm_server.queue(cut_turn(kind, cut), Turn(text=ANSWER, usage={"input": 9, "output": 4}))
    session = new_session(store, workdir)
    tool = EchoTool()
    options = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    async with Harness(session, make_provider(kind, llm_server), [tool], options=options) as h:
        handle = await h.prompt("answer me")
        outcome = await handle.wait()
    recs = session.store.records("main")
    assert outcome == "completed", of_type(recs, "run_finished")
    assert len(llm_server.requests) == 2

    failed = of_type(recs, "provider_request_failed")
    assert len(failed) == 1, failed
    assert failed[0]["reason"] == REASONS[cut], failed[0]
    assert failed[0]["retryable"] is True and failed[0]["status"] is None
    assert (failed[0]["turn"], failed[0]["attempt"]) == (1, 1)
    finished = of_type(recs, "provider_request_finished")
    assert [(r["turn"], r["attempt"]) for r in finished] == [(1, 2)]
    assert finished[0]["stopReason"] == "stop"

    # The retry's answer alone, under the provisioned id; the cut attempt left nothing.
    path = messages_on_path(session)
    assert [e["message"]["role"] for e in path] == ["user", "assistant"]
    assert path[1]["message"]["content"] == [{"type": "text", "text": ANSWER}]
    assert path[1]["id"] == of_type(recs, "provider_request_started")[0]["responseEntryId"]
    assert tool.calls == []  # a tool call from the cut stream never ran
    session_id = session.id
    session.close()
    dumped = stored_bytes(store, session_id)
    assert ANSWER in dumped  # the scan reads what was stored
    assert "PARTIAL" not in dumped and "call_cut_1" not in dumped
    assert of_type(recs, "run_finished")[0]["outcome"] == "completed"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_every_attempt_cut_fails_the_run_at_the_attempt_cap(
    kind: str, store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    cuts = [cut_turn(kind, c) for c in ("no_end_marker", "reset", "in_tool_arguments")]
    llm_server.queue(*cuts, Turn(text="never requested"))
    session = new_session(store, workdir)
    options = HarnessOptions(attempt_cap=3, retry_initial=0.01, retry_max=0.05)
    async with Harness(
        session, make_provider(kind, llm_server), [EchoTool()], options=options
    ) as h:
        handle = await h.prompt("answer me")
        outcome = await handle.wait()
    recs = session.store.records("main")
    assert outcome == "failed"
    assert len(llm_server.requests) == 3  # the cap, no more
    assert llm_server.pending == 1
    failed = of_type(recs, "provider_request_failed")
    assert [r["attempt"] for r in failed] == [1, 2, 3]
    assert {r["reason"] for r in failed} == {"stream_truncated"}
    assert not of_type(recs, "provider_request_finished")
    done = of_type(recs, "run_finished")
    assert len(done) == 1 and done[0]["outcome"] == "failed"
    assert "attempt cap" in str(done[0].get("reason")), done[0]
    assert [e["message"]["role"] for e in messages_on_path(session)] == ["user"]
    session_id = session.id
    session.close()
    assert "PARTIAL" not in stored_bytes(store, session_id)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_abort_during_the_retry_keeps_only_the_retry_text(
    kind: str, store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    """The first attempt is cut; the retry streams some text and stalls; an abort then keeps
    the retry's partial text as the aborted answer, never the cut attempt's."""
    second = "SECOND-attempt-text"
    llm_server.queue(
        cut_turn(kind, "no_end_marker"),
        Turn(text=second, delay=20.0, delay_after=5 if kind == "anthropic" else 4),
    )
    provider: Any = make_provider(kind, llm_server)
    provider.idle_timeout = provider.read_timeout = 30.0  # the abort ends the stall, not this
    session = new_session(store, workdir)
    options = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    async with Harness(session, provider, [EchoTool()], options=options) as h:
        deltas: list[tuple[int, str]] = []
        attempt = [0]

        def on_event(e: dict[str, Any]) -> None:
            if e["type"] == "provider_request_start":
                attempt[0] = int(e["attempt"])
            elif e["type"] == "message_update" and "delta" in e:
                deltas.append((attempt[0], str(e["delta"])))

        h.subscribe(on_event)
        handle = await h.prompt("answer me")
        deadline = time.monotonic() + 20
        while not any(a == 2 for a, _ in deltas):  # the retry is streaming
            assert time.monotonic() < deadline, deltas
            await anyio.sleep(0.01)
        await h.abort()
        assert await handle.wait() == "aborted"
    assert any(a == 1 and d for a, d in deltas)  # the cut attempt did stream text
    path = messages_on_path(session)
    assert [e["message"]["role"] for e in path] == ["user", "assistant"]
    kept = path[1]["message"]
    assert kept["stopReason"] == "aborted"
    text = "".join(b["text"] for b in kept["content"])
    assert text and second.startswith(text), text
    recs = session.store.records("main")
    assert [r.get("reason") for r in of_type(recs, "provider_request_failed")] == [
        "stream_truncated",
        None,
    ]
    session_id = session.id
    session.close()
    assert "PARTIAL" not in stored_bytes(store, session_id)


class _EndsWithoutDone:
    """A provider whose first attempt's stream stops without :class:`Done` (any provider's
    fault, not only a wire's): the harness's own check."""

    name = "no-done"
    model = "m"
    context_window = 100_000

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        yield TextDelta("PARTIAL-")
        if request.attempt > 1:
            message = {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}
            yield Done(
                {**message, "provider": self.name, "model": self.model, "stopReason": "stop"}
            )


async def test_a_stream_without_done_is_a_truncated_attempt(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    options = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    async with Harness(session, _EndsWithoutDone(), [EchoTool()], options=options) as h:
        handle = await h.prompt("answer me")
        assert await handle.wait() == "completed"
    recs = session.store.records("main")
    assert [r["reason"] for r in of_type(recs, "provider_request_failed")] == ["stream_truncated"]
    path = messages_on_path(session)
    assert path[-1]["message"]["content"] == [{"type": "text", "text": ANSWER}]
    session_id = session.id
    session.close()
    assert "PARTIAL" not in stored_bytes(store, session_id)


async def test_an_acp_client_reads_the_cut_attempt_closed_before_the_retry(
    store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    """The ACP door: text already sent to an editor cannot be taken back, so the translator
    closes a failed attempt's partial text with a notice before the retry's text arrives (the
    same events a live ``durable-harness acp`` session translates)."""
    from durable_harness.acp.updates import EventTranslator

    llm_server.queue(cut_turn("openai", "reset"), Turn(text=ANSWER))
    session = new_session(store, workdir)
    translator = EventTranslator(str(workdir), lambda _id: None)
    chunks: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        for update in translator.feed(event):
            content = getattr(update, "content", None)
            if getattr(update, "session_update", None) == "agent_message_chunk":
                chunks.append(content.text)  # type: ignore[union-attr]

    options = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    async with Harness(session, make_provider("openai", llm_server), [], options=options) as h:
        h.subscribe(on_event)
        handle = await h.prompt("answer me")
        assert await handle.wait() == "completed"
    session.close()
    shown = "".join(chunks)
    partial, notice, retry = shown.partition("[attempt 1 failed:")
    assert notice, shown
    assert partial.strip() and PARTIAL.startswith(partial.strip()), shown
    assert retry.endswith(ANSWER) and "; retrying]" in retry, shown
