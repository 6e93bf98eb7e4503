"""Provider retries: one intent and one settlement per attempt, one assistant entry per turn,
the durable attempt cap, non-retryable failures, and empty answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.errors import ProviderError
from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.base import Done, ProviderEvent, ProviderRequest, TextDelta
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.storage import Store

from .util import EchoTool, messages_on_path, new_session, of_type, types_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = HarnessOptions(retry_initial=0.01, retry_max=0.02)


def options(**kw: Any) -> HarnessOptions:
    return HarnessOptions(retry_initial=0.01, retry_max=0.02, **kw)


def assistants(session: Any) -> list[dict[str, Any]]:
    return [
        e for e in session.store.iter_entries(("message",)) if e["message"]["role"] == "assistant"
    ]


class ListProvider:
    """A provider answering each attempt from a list of ``message`` dicts or exceptions."""

    name = "listed"
    model = "listed-1"
    context_window = 100_000

    def __init__(self, answers: list[dict[str, Any] | Exception]) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else {"content": []}
        if isinstance(answer, Exception):
            raise answer
        for block in answer.get("content") or []:
            if block.get("type") == "text" and block.get("text"):
                yield TextDelta(block["text"])
        yield Done(
            {
                "role": "assistant",
                "content": answer.get("content"),
                "provider": self.name,
                "model": self.model,
                "stopReason": "stop",
                "usage": {
                    "input": 1,
                    "output": 1,
                    "cacheRead": 0,
                    "cacheWrite": 0,
                    "totalTokens": 2,
                    "cost": {
                        "input": 0.0,
                        "output": 0.0,
                        "cacheRead": 0.0,
                        "cacheWrite": 0.0,
                        "total": 0.0,
                    },
                },
            }
        )


def text(t: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": t}]}


async def test_failed_attempts_are_recorded_and_the_tree_grows_once(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([{"text": "finally", "fail_attempts": 2}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=FAST) as h:
        handle = await h.prompt("try hard")
        assert await handle.wait() == "completed"
    recs = session.store.records("main")
    assert types_of(recs) == [
        "run_started",
        "provider_request_started",
        "provider_request_failed",
        "provider_request_started",
        "provider_request_failed",
        "provider_request_started",
        "provider_request_finished",
        "run_finished",
    ]
    starts = of_type(recs, "provider_request_started")
    assert [(r["turn"], r["attempt"]) for r in starts] == [(1, 1), (1, 2), (1, 3)]
    assert len({r["responseEntryId"] for r in starts}) == 1
    failed = of_type(recs, "provider_request_failed")
    assert [(r["attempt"], r["status"], r["retryable"]) for r in failed] == [
        (1, 503, True),
        (2, 503, True),
    ]
    finished = of_type(recs, "provider_request_finished")[0]
    assert finished["attempt"] == 3 and finished["entryId"] == starts[0]["responseEntryId"]
    entries = assistants(session)
    assert len(entries) == 1 and entries[0]["id"] == starts[0]["responseEntryId"]
    assert entries[0]["message"]["content"] == [{"type": "text", "text": "finally"}]


async def test_attempt_cap_fails_the_run_with_a_reason_naming_the_cap(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([{"text": "never", "fail_attempts": 2}])
    async with Harness(
        session, provider, [EchoTool()], cwd=workdir, options=options(attempt_cap=2)
    ) as h:
        events: list[dict[str, Any]] = []
        h.subscribe(events.append)
        handle = await h.prompt("try hard")
        assert await handle.wait() == "failed"
    recs = session.store.records("main")
    starts = of_type(recs, "provider_request_started")
    assert [r["attempt"] for r in starts] == [1, 2]  # never a third
    assert len(of_type(recs, "provider_request_failed")) == 2
    finished = of_type(recs, "run_finished")[0]
    assert finished["outcome"] == "failed"
    reason = finished["reason"]
    assert "cap" in reason and "2 of 2" in reason, reason
    assert assistants(session) == []
    assert session.lane("main").run_id is None
    assert events[-1]["type"] == "run_end" and events[-1]["outcome"] == "failed"


async def test_non_retryable_provider_error_fails_at_once(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = ListProvider([ProviderError("bad request: no such model", status=400)])
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=FAST) as h:
        handle = await h.prompt("hello")
        assert await handle.wait() == "failed"
    assert provider.calls == 1
    recs = session.store.records("main")
    assert types_of(recs) == [
        "run_started",
        "provider_request_started",
        "provider_request_failed",
        "run_finished",
    ]
    failed = recs[2]
    assert failed["retryable"] is False and failed["status"] == 400
    assert "no such model" in failed["error"]
    assert recs[3]["outcome"] == "failed" and "no such model" in recs[3]["reason"]
    assert assistants(session) == []


@pytest.mark.parametrize(
    "empty",
    [
        {"content": []},
        {"content": [{"type": "text", "text": "   "}]},
        {"content": [{"type": "thinking", "thinking": "hmm"}]},
    ],
    ids=["no-blocks", "blank-text", "thinking-only"],
)
async def test_empty_answer_is_never_stored_and_is_retried(
    empty: dict[str, Any], store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ListProvider([empty, text("real answer")])
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=FAST) as h:
        handle = await h.prompt("hello")
        assert await handle.wait() == "completed"
    recs = session.store.records("main")
    failed = of_type(recs, "provider_request_failed")
    assert len(failed) == 1 and "empty" in failed[0]["error"]
    entries = assistants(session)
    assert len(entries) == 1
    assert entries[0]["message"]["content"] == [{"type": "text", "text": "real answer"}]
    assert [e["message"]["role"] for e in messages_on_path(session)] == ["user", "assistant"]


async def test_always_empty_answers_fail_the_run_and_store_nothing(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ListProvider([])  # every answer is empty
    async with Harness(
        session, provider, [EchoTool()], cwd=workdir, options=options(attempt_cap=3)
    ) as h:
        handle = await h.prompt("hello")
        assert await handle.wait() == "failed"
    assert provider.calls == 3
    assert assistants(session) == []
    assert len(of_type(session.store.records(), "provider_request_failed")) == 3
    for m in session.context().messages:
        assert m["role"] == "user"


async def test_attempts_are_counted_per_turn(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider(
        [
            {
                "text": "tool",
                "fail_attempts": 1,
                "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}],
            },
            {"text": "done", "fail_attempts": 1},
        ]
    )
    async with Harness(
        session, provider, [EchoTool()], cwd=workdir, options=options(attempt_cap=2)
    ) as h:
        handle = await h.prompt("hello")
        assert await handle.wait() == "completed"
    starts = of_type(session.store.records(), "provider_request_started")
    assert [(r["turn"], r["attempt"]) for r in starts] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len(assistants(session)) == 2
