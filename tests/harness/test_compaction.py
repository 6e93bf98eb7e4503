"""Compaction (by hand and automatic) and navigation with and without a branch summary."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import RunInProgress
from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.base import ProviderEvent, ProviderRequest, TextDelta
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import Store

from .util import (
    EchoTool,
    GatedProvider,
    assert_same_commit,
    messages_on_path,
    new_session,
    of_type,
    one_result_per_call,
    types_of,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

LONG = "lorem ipsum dolor sit amet " * 8  # ~54 tokens


class Recording(ScriptedProvider):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[ProviderRequest] = []

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        async for event in super().stream(request):
            yield event


def tool_turn(tag: str) -> dict[str, Any]:
    return {
        "text": f"{tag}: {LONG}",
        "tool_calls": [{"name": "echo", "arguments": {"text": f"{tag} {LONG}"}}],
    }


BY_PROMPT = {
    f"prompt {n}": [tool_turn(f"run{n}a"), tool_turn(f"run{n}b"), {"text": f"run{n} done"}]
    for n in (1, 2, 3)
}


async def three_runs(h: Harness) -> None:
    for n in (1, 2, 3):
        handle = await h.prompt(f"prompt {n}")
        assert await handle.wait() == "completed"


def summary_text(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message["content"])


@pytest.mark.parametrize("keep", [0, 40, 150, 400, 100_000])
async def test_compact_cuts_at_a_user_message_and_keeps_whole_exchanges(
    keep: int, store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([], by_prompt=BY_PROMPT)
    opts = HarnessOptions(keep_recent_tokens=keep)
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=opts) as h:
        await three_runs(h)
        before = session.context()
        n_records = len(session.store.records())
        entry = await h.compact()

    assert entry["type"] == "compaction"
    assert session.leaf() == entry["id"]
    assert entry["parentId"] == before.entry_ids[-1]
    assert entry["summary"]
    first_kept = entry["firstKeptEntryId"]
    if first_kept is not None:
        kept = session.store.get_entry(first_kept)
        assert kept["type"] == "message"
        assert kept["message"]["role"] == "user", kept["message"]["role"]
    if keep >= 100_000:
        assert first_kept is not None  # everything fits: only the first prompt is summarized

    ctx = session.context()
    assert ctx.messages[0]["role"] == "user"
    assert "<summary>" in summary_text(ctx.messages[0])
    assert entry["summary"] in summary_text(ctx.messages[0])
    one_result_per_call(ctx.messages)
    # What follows the summary is exactly the old context from the first kept entry on.
    start = before.entry_ids.index(first_kept) if first_kept else len(before.entry_ids)
    assert ctx.entry_ids[1:] == before.entry_ids[start:]
    for m in ctx.messages[1:]:
        assert m.get("role") != "toolResult" or any(
            b.get("id") == m["toolCallId"]
            for prev in ctx.messages
            if prev.get("role") == "assistant"
            for b in prev["content"]
            if isinstance(b, dict)
        )

    # The summary request followed intent and settlement rules.
    new = session.store.records()[n_records:]
    assert types_of(new) == ["provider_request_started", "provider_request_finished"]
    intent, fin = new
    assert intent["purpose"] == fin["purpose"] == "compaction"
    assert fin["entryId"] == entry["id"]
    assert intent["responseEntryId"] == entry["id"]
    stored = session.store.get_entry(entry["id"])
    assert stored is not None and stored["summary"] == entry["summary"]
    assert intent["seq"] < stored["seq"]
    assert_same_commit(session, stored["seq"], fin["seq"])


async def test_compact_by_hand_during_a_run_is_refused(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = GatedProvider([{"text": "slow"}])
    async with Harness(session, provider, [], cwd=workdir) as h:
        handle = await h.prompt("x")
        with pytest.raises(RunInProgress):
            await h.compact()
        provider.release.set()
        await handle.wait()
    assert session.store.iter_entries(("compaction",)) == []


async def test_automatic_compaction_at_a_checkpoint(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = Recording(
        [tool_turn("big"), {"text": "finished after compaction"}], context_window=300
    )
    opts = HarnessOptions(compact_reserve=150, keep_recent_tokens=50)
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=opts) as h:
        handle = await h.prompt("short prompt")
        assert await handle.wait() == "completed"

    recs = session.store.records("main")
    assert types_of(recs) == [
        "run_started",
        "provider_request_started",
        "provider_request_finished",
        "tool_started",
        "tool_finished",
        "save_point",
        "provider_request_started",  # the compaction's intent
        "provider_request_finished",  # its settlement, with the compaction entry
        "provider_request_started",
        "provider_request_finished",
        "run_finished",
    ]
    intent, fin = recs[6], recs[7]
    assert intent["purpose"] == fin["purpose"] == "compaction"
    assert intent["runId"] == fin["runId"] == handle.run_id
    compactions = session.store.iter_entries(("compaction",))
    assert len(compactions) == 1
    comp = compactions[0]
    assert fin["entryId"] == comp["id"] == intent["responseEntryId"]
    assert intent["seq"] < comp["seq"]
    assert_same_commit(session, comp["seq"], fin["seq"])
    assert comp["firstKeptEntryId"] is None or (
        session.store.get_entry(comp["firstKeptEntryId"])["message"]["role"] == "user"
    )
    # Turn numbering is unaffected: the next request is turn 2 and the run has two turns.
    turn_starts = [r for r in of_type(recs, "provider_request_started") if r.get("purpose") is None]
    assert [r["turn"] for r in turn_starts] == [1, 2]
    # The request after the compaction carried the summary first.
    purposes = [r.purpose for r in provider.requests]
    assert purposes == ["turn", "compaction", "turn"]
    after = provider.requests[2]
    assert "<summary>" in summary_text(after.messages[0])
    one_result_per_call(after.messages)
    # The compaction request summarized what came before, and got no tools to call.
    assert len(provider.requests[1].messages) > 1
    # The tree still holds every entry; only the context is shorter.
    roles = [e["message"]["role"] for e in messages_on_path(session)]
    assert roles == ["user", "assistant", "toolResult", "assistant"]
    ctx = session.context()
    assert ctx.messages[-1]["content"] == [{"type": "text", "text": "finished after compaction"}]
    one_result_per_call(ctx.messages)


async def test_no_automatic_compaction_with_room(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([tool_turn("big"), {"text": "done"}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        handle = await h.prompt("short prompt")
        assert await handle.wait() == "completed"
    assert session.store.iter_entries(("compaction",)) == []
    assert all(r.get("purpose", "turn") == "turn" for r in session.store.records())


async def test_navigate_with_summary_is_durable(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([], by_prompt=BY_PROMPT)
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        await three_runs(h)
        path = messages_on_path(session)
        old_leaf = session.leaf()
        target = path[4]["id"]  # the result of run 1's second tool call
        n_entries = session.store.entry_count()
        n_records = len(session.store.records())
        summary = await h.navigate(target, summarize=True)
        assert summary is not None

    assert summary["type"] == "branch_summary"
    assert summary["parentId"] == target
    assert summary["fromId"] == old_leaf
    assert summary["summary"]
    assert session.leaf() == summary["id"]
    assert session.store.entry_count() == n_entries + 1
    new = session.store.records()[n_records:]
    assert types_of(new) == ["provider_request_started", "provider_request_finished"]
    assert new[0]["purpose"] == new[1]["purpose"] == "branch_summary"
    assert new[1]["entryId"] == summary["id"]
    assert new[0]["responseEntryId"] == summary["id"]
    assert new[0]["seq"] < session.store.get_entry(summary["id"])["seq"]
    assert_same_commit(session, session.store.get_entry(summary["id"])["seq"], new[1]["seq"])

    # Durable across a reopen.
    sid = session.id
    session.close()
    reopened = Session(store.open_session(sid))
    try:
        assert reopened.leaf() == summary["id"]
        stored = reopened.entry(summary["id"])
        assert stored["parentId"] == target and stored["type"] == "branch_summary"
        ctx = reopened.context()
        assert ctx.entry_ids[-1] == summary["id"]
        assert ctx.messages[-1]["role"] == "user"
        assert summary["summary"] in summary_text(ctx.messages[-1])
        assert ctx.entry_ids[:-1] == [e["id"] for e in path[:5]]
        one_result_per_call(ctx.messages)
    finally:
        reopened.close()


async def test_navigate_without_summary_only_moves_the_leaf(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([], by_prompt=BY_PROMPT)
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        await three_runs(h)
        target = messages_on_path(session)[0]["id"]
        n_entries = session.store.entry_count()
        n_records = len(session.store.records())
        assert await h.navigate(target, summarize=False) is None
        assert session.leaf() == target
        assert session.store.entry_count() == n_entries
        assert len(session.store.records()) == n_records
        # The lane continues from there: the next prompt is a child of the target.
        handle = await h.prompt("prompt 2")
        assert await handle.wait() == "completed"
        child = session.store.get_entry(
            of_type(session.store.records(), "run_started")[-1]["promptEntryId"]
        )
        assert child["parentId"] == target
    sid = session.id
    session.close()
    reopened = Session(store.open_session(sid))
    try:
        assert reopened.path(reopened.leaf())[0]["id"] == target
    finally:
        reopened.close()


class StallingSummary(ScriptedProvider):
    """Streams part of a compaction summary, then stalls (so a test can abort mid-summary)."""

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        if request.purpose == "compaction":
            yield TextDelta("partial summary")
            await anyio.sleep_forever()  # until the abort cancels it
        async for event in super().stream(request):
            yield event


async def test_abort_during_automatic_compaction_stores_no_partial_summary(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = StallingSummary([tool_turn("big"), {"text": "never"}], context_window=300)
    opts = HarnessOptions(compact_reserve=150, keep_recent_tokens=50)
    summarizing = anyio.Event()
    async with Harness(session, provider, [EchoTool()], cwd=workdir, options=opts) as h:
        h.subscribe(lambda e: summarizing.set() if e.get("delta") == "partial summary" else None)
        handle = await h.prompt("short prompt")
        with anyio.fail_after(5):
            await summarizing.wait()
        await h.abort()
        assert await handle.wait() == "aborted"
    recs = session.store.records("main")
    intent = [r for r in of_type(recs, "provider_request_started") if r.get("purpose")][-1]
    assert intent["purpose"] == "compaction"
    assert session.store.get_entry(intent["responseEntryId"]) is None
    assert session.store.iter_entries(("compaction",)) == []
    roles = [e["message"]["role"] for e in messages_on_path(session)]
    assert roles == ["user", "assistant", "toolResult"]
    texts = [summary_text(m) for m in session.context().messages]
    assert "partial summary" not in texts
    assert of_type(recs, "run_finished")[0]["outcome"] == "aborted"


async def test_a_keep_that_cannot_shrink_the_context_is_clamped_once(
    store: Store, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``keep_recent_tokens`` at or above ``context_window - compact_reserve`` is clamped to
    half of that budget when the harness is built, with one warning naming the values; every
    compaction then brings the context under the limit (issue 20: it compacted again at
    every checkpoint)."""
    from durable_harness.session.context import estimate_tokens

    session = new_session(store, workdir)
    provider = ScriptedProvider([], by_prompt=BY_PROMPT, context_window=400)
    opts = HarnessOptions(compact_reserve=150, keep_recent_tokens=100_000)
    with caplog.at_level("WARNING", logger="durable_harness.harness"):
        async with Harness(session, provider, [EchoTool()], cwd=workdir, options=opts) as h:
            await three_runs(h)
    clamps = [r.getMessage() for r in caplog.records if "clamped" in r.getMessage()]
    assert len(clamps) == 1, clamps
    assert "keep_recent_tokens=100000" in clamps[0] and "= 250" in clamps[0]
    assert "125 tokens are kept" in clamps[0]
    compactions = session.store.iter_entries(("compaction",))
    assert compactions, "the runs outgrew the window: a compaction was due"
    for comp in compactions:
        after = session.context(comp["id"]).messages
        assert estimate_tokens(after) < 250, (comp["id"], estimate_tokens(after))


def test_negative_compaction_settings_are_refused_by_name() -> None:
    from durable_harness.errors import FormatError

    with pytest.raises(FormatError, match="keep_recent_tokens"):
        HarnessOptions(keep_recent_tokens=-1)
    with pytest.raises(FormatError, match="compact_reserve"):
        HarnessOptions(compact_reserve=-5)
