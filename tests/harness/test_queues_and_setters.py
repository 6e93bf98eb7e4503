"""Queues (steer, follow-up, next-run), deferred setters, client keys and lanes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import NoOpenRun, RunInProgress
from durable_harness.harness.harness import Harness
from durable_harness.providers.base import ProviderEvent, ProviderRequest
from durable_harness.providers.scripted import ScriptedProvider
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

TOOL_TURN = {"text": "Echoing.", "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}


class Recording(ScriptedProvider):
    """A scripted provider that keeps every request it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[ProviderRequest] = []

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        async for event in super().stream(request):
            yield event


def texts(session: Any, lane: str = "main") -> list[str]:
    return [
        "".join(b.get("text", "") for b in e["message"]["content"] if isinstance(b, dict))
        for e in messages_on_path(session, lane)
    ]


class RunEnds:
    """Collects ``run_end`` events; ``wait(n)`` waits until ``n`` runs ended."""

    def __init__(self, h: Harness) -> None:
        self.ended: list[dict[str, Any]] = []
        self._changed = anyio.Event()
        h.subscribe(self._on)

    def _on(self, e: dict[str, Any]) -> None:
        if e["type"] == "run_end":
            self.ended.append(e)
            self._changed.set()
            self._changed = anyio.Event()

    async def wait(self, n: int) -> list[dict[str, Any]]:
        with anyio.fail_after(5):
            while len(self.ended) < n:
                await self._changed.wait()
        return self.ended


async def test_follow_up_waits_for_the_stop_and_continues_the_same_run(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([TOOL_TURN, {"text": "first stop"}, {"text": "after follow-up"}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        handle = await h.prompt("start")
        item = await h.follow_up("one more thing")
        assert await handle.wait() == "completed"
    recs = session.store.records("main")
    assert {r.get("runId") for r in recs if r["type"] != "queue_enqueued"} == {handle.run_id}
    assert types_of(recs) == [
        "run_started",
        "queue_enqueued",
        "provider_request_started",
        "provider_request_finished",
        "tool_started",
        "tool_finished",
        "save_point",  # between turns 1 and 2: the follow-up is not delivered here
        "provider_request_started",
        "provider_request_finished",
        "queue_consumed",  # the run would stop: the follow-up is delivered
        "save_point",
        "provider_request_started",
        "provider_request_finished",
        "run_finished",
    ]
    saves = of_type(recs, "save_point")
    assert saves[0]["deliveredEntries"] == []
    assert len(saves[1]["deliveredEntries"]) == 1
    consumed = of_type(recs, "queue_consumed")[0]
    assert consumed["queue"] == "follow_up" and consumed["itemIds"] == [item]
    assert texts(session) == [
        "start",
        "Echoing.",
        "echo: x",
        "first stop",
        "one more thing",
        "after follow-up",
    ]
    assert of_type(recs, "run_finished")[0]["outcome"] == "completed"


async def test_steer_is_delivered_at_the_next_checkpoint_even_without_tools(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider([{"text": "answer"}, {"text": "steered answer"}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        handle = await h.prompt("start")
        await h.steer("actually, this")
        assert await handle.wait() == "completed"
    assert texts(session) == ["start", "answer", "actually, this", "steered answer"]


async def test_next_run_starts_after_the_current_run_settles(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = ScriptedProvider(
        [TOOL_TURN, {"text": "first done"}], by_prompt={"second": [{"text": "second done"}]}
    )
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        ends = RunEnds(h)
        handle = await h.prompt("first")
        item = await h.next_run("second")
        assert await handle.wait() == "completed"
        ended = await ends.wait(2)
    assert [e["outcome"] for e in ended] == ["completed", "completed"]
    second_id = ended[1]["runId"]
    assert second_id != handle.run_id
    recs = session.store.records("main")
    first_finished = next(r for r in of_type(recs, "run_finished") if r["runId"] == handle.run_id)
    started2 = next(r for r in of_type(recs, "run_started") if r["runId"] == second_id)
    assert started2["seq"] > first_finished["seq"]
    consumed = of_type(recs, "queue_consumed")
    assert len(consumed) == 1 and consumed[0]["queue"] == "next_run"
    assert consumed[0]["itemIds"] == [item] and consumed[0]["runId"] == second_id
    # The prompt entry, run_started and the receipt's consumption: one commit.
    prompt_entry = session.store.get_entry(started2["promptEntryId"])
    assert_same_commit(session, prompt_entry["seq"], started2["seq"], consumed[0]["seq"])
    # No save point of the first run delivered it.
    assert all(s["deliveredEntries"] == [] for s in of_type(recs, "save_point"))
    assert texts(session) == ["first", "Echoing.", "echo: x", "first done", "second", "second done"]


async def test_next_run_on_an_idle_lane_starts_at_once(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = GatedProvider([{"text": "slow"}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        ends = RunEnds(h)
        item = await h.next_run("go now")
        # A run is live on the lane as soon as next_run returns.
        with pytest.raises(RunInProgress):
            await h.prompt("another")
        await h.steer("steer it")  # no NoOpenRun: the run is open
        provider.release.set()
        ended = await ends.wait(1)
    assert ended[0]["outcome"] == "completed"
    recs = session.store.records("main")
    assert types_of(recs)[:3] == ["queue_enqueued", "run_started", "queue_consumed"]
    assert recs[0].get("runId") is None and recs[0]["itemId"] == item
    assert recs[2]["itemIds"] == [item]
    assert texts(session)[0] == "go now"


async def test_steer_and_follow_up_without_a_run_raise(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    async with Harness(session, ScriptedProvider([]), [], cwd=workdir) as h:
        with pytest.raises(NoOpenRun):
            await h.steer("nobody listens")
        with pytest.raises(NoOpenRun):
            await h.follow_up("nobody listens")
    assert session.store.records() == []
    assert session.store.entry_count() == 0


async def test_setters_during_a_run_are_deferred_to_the_next_save_point(
    store: Store, workdir: Path
) -> None:
    session = new_session(store, workdir)
    provider = Recording([TOOL_TURN, {"text": "done"}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        handle = await h.prompt("start")
        prompt_id = session.leaf()
        assert prompt_id is not None
        await h.set_model("scripted", "model-2", client_key="set-model-1")  # its own family
        await h.set_thinking_level("high")
        await h.set_name("my session")
        await h.set_label(prompt_id, "the start")
        # Durable when the call returns, not applied yet.
        recs = session.store.records("main")
        deferred = of_type(recs, "write_deferred")
        assert [d["write"]["type"] for d in deferred] == [
            "model_change",
            "thinking_level_change",
            "session_info",
            "label",
        ]
        assert all(d["runId"] == handle.run_id for d in deferred)
        assert session.store.iter_entries(("model_change", "label", "session_info")) == []
        assert session.name is None and session.labels() == {}
        assert h.accepted("set-model-1") == deferred[0]
        assert await handle.wait() == "completed"

    recs = session.store.records("main")
    deferred_ids = [d["id"] for d in of_type(recs, "write_deferred")]
    save = of_type(recs, "save_point")[0]
    assert save["appliedWrites"] == deferred_ids
    assert of_type(recs, "run_finished")[0]["appliedWrites"] == []
    written = session.store.iter_entries(
        ("model_change", "thinking_level_change", "session_info", "label")
    )
    assert [e["type"] for e in written] == [
        "model_change",
        "thinking_level_change",
        "session_info",
        "label",
    ]
    # Applied in the save point's commit, after turn 1's results and before turn 2's request.
    assert_same_commit(session, *[e["seq"] for e in written], save["seq"])
    tool_done = of_type(recs, "tool_finished")[0]
    turn2 = next(r for r in of_type(recs, "provider_request_started") if r["turn"] == 2)
    assert tool_done["seq"] < written[0]["seq"] and save["seq"] < turn2["seq"]
    assert session.name == "my session"
    assert session.labels() == {prompt_id: "the start"}
    # Turn 1 used the old settings; turn 2 the new ones.
    turns = [r for r in provider.requests if r.purpose == "turn"]
    assert [(r.model, r.thinking_level) for r in turns] == [
        ("scripted-1", "off"),
        ("model-2", "high"),
    ]
    assert turn2["model"] == "model-2"


async def test_setters_outside_a_run_apply_at_once(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    async with Harness(session, ScriptedProvider([{"text": "hi"}]), [], cwd=workdir) as h:
        handle = await h.prompt("hello")
        await handle.wait()
        before = len(session.store.records())
        await h.set_model("other", "model-3")
        assert session.store.get_entry(session.leaf())["type"] == "model_change"
        await h.set_thinking_level("low")
        await h.set_name("named")
        target = messages_on_path(session)[0]["id"]
        await h.set_label(target, "first prompt")
        assert len(session.store.records()) == before  # no deferred records
        assert session.name == "named"
        assert session.labels() == {target: "first prompt"}
        ctx = session.context()
        assert ctx.model == {"provider": "other", "modelId": "model-3"}
        assert ctx.thinking_level == "low"
        types = [e["type"] for e in session.path(session.leaf())]
        assert types[-4:] == ["model_change", "thinking_level_change", "session_info", "label"]


async def test_client_keys_find_the_accepting_record(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = GatedProvider([{"text": "slow"}, {"text": "more"}])
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        assert h.accepted("k-prompt") is None
        handle = await h.prompt("hello", client_key="k-prompt")
        rec = h.accepted("k-prompt")
        assert rec is not None and rec["type"] == "run_started"
        assert rec["runId"] == handle.run_id and rec["clientKey"] == "k-prompt"
        steer_id = await h.steer("steer", client_key="k-steer")
        got = h.accepted("k-steer")
        assert got is not None and got["type"] == "queue_enqueued" and got["itemId"] == steer_id
        await h.set_name("x", lane="main")
        await h.set_model("p", "m", client_key="k-model")
        got = h.accepted("k-model")
        assert got is not None and got["type"] == "write_deferred"
        assert h.accepted("k-steer", lane="other") is None
        assert h.accepted("unknown") is None
        provider.release.set()
        await handle.wait()
    # Durable: a reader of the stored log finds the same records.
    keyed = [r for r in session.store.records("main") if r.get("clientKey")]
    assert [r["clientKey"] for r in keyed] == ["k-prompt", "k-steer", "k-model"]


async def test_prompt_on_a_busy_lane_raises(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    provider = GatedProvider([{"text": "slow"}])
    async with Harness(session, provider, [], cwd=workdir) as h:
        handle = await h.prompt("first")
        with pytest.raises(RunInProgress):
            await h.prompt("second")
        provider.release.set()
        assert await handle.wait() == "completed"
        again = await h.prompt("third")
        assert await again.wait() == "completed"
    prompts = [
        r["prompt"]["content"][0]["text"] for r in of_type(session.store.records(), "run_started")
    ]
    assert prompts == ["first", "third"]


async def test_two_lanes_run_concurrently_with_their_own_logs(store: Store, workdir: Path) -> None:
    session = new_session(store, workdir)
    session.create_lane("side")
    # both lanes' first turns wait at the gate until both runs are open and steered
    provider = GatedProvider(
        [],
        only_prompts={"main work", "side work"},
        by_prompt={
            "main work": [TOOL_TURN, {"text": "main done"}],
            "side work": [TOOL_TURN, {"text": "side done"}],
        },
    )
    async with Harness(session, provider, [EchoTool()], cwd=workdir) as h:
        main = await h.prompt("main work")
        side = await h.prompt("side work", lane="side")
        assert main.lane == "main" and side.lane == "side"
        await h.steer("main steer")
        await h.steer("side steer", lane="side")
        provider.release.set()
        assert await main.wait() == "completed"
        assert await side.wait() == "completed"

    main_recs = session.store.records("main")
    side_recs = session.store.records("side")
    assert {r["lane"] for r in main_recs} == {"main"}
    assert {r["lane"] for r in side_recs} == {"side"}
    assert {r["runId"] for r in main_recs} == {main.run_id}
    assert {r["runId"] for r in side_recs} == {side.run_id}
    assert types_of(main_recs) == types_of(side_recs)
    # Both were open at once: each started before the other finished.
    main_fin = of_type(main_recs, "run_finished")[0]["seq"]
    side_fin = of_type(side_recs, "run_finished")[0]["seq"]
    assert of_type(side_recs, "run_started")[0]["seq"] < main_fin
    assert of_type(main_recs, "run_started")[0]["seq"] < side_fin
    # Each lane's tree holds only its own conversation and steer.
    assert texts(session, "main") == ["main work", "Echoing.", "echo: x", "main steer", "main done"]
    assert texts(session, "side") == ["side work", "Echoing.", "echo: x", "side steer", "side done"]
    for lane in ("main", "side"):
        one_result_per_call(session.context(lane=lane).messages)
        assert session.lane(lane).run_id is None
