"""A tool call has one identity: its call key (assistant entry id + index), never the provider's
id alone. Providers repeat ids within one message; the harness makes them unique before the
entry is stored, records the renames, and results pair with calls by that identity. A run can
never loop: a bound on tool calls (and turns) per run, recorded in ``run_started``, fails it."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools

from .helpers import (
    BACKENDS,
    dh,
    effects,
    main_lane,
    plan_json,
    read_session,
    session_id,
    store_spec,
    write_script,
)
from .test_plan_table import TOOLS, Log

TWO_SAME_IDS = [
    {
        "text": "two appends, one id",
        "tool_calls": [
            {"id": "call_0", "name": "append_file", "arguments": {"path": "effects.log",
                                                                  "content": "a\n"}},
            {"id": "call_0", "name": "append_file", "arguments": {"path": "effects.log",
                                                                  "content": "b\n"}},
        ],
    },
    {"text": "done"},
]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_provider_ids_run_each_call_once(backend: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)

    async def go() -> tuple[str, str]:
        with Session(open_store(spec).create_session(str(work))) as s:
            async with Harness(s, ScriptedProvider(TWO_SAME_IDS), builtin_tools()) as h:
                handle = await h.prompt("go")
                return await handle.wait(), s.id

    outcome, sid = anyio.run(go)
    assert outcome == "completed"
    assert effects(work) == {"a": 1, "b": 1}
    records, entries, _ = read_session(spec, sid)
    (finished,) = [
        r for r in records if r["type"] == "provider_request_finished" and r["turn"] == 1
    ]
    assert finished["renamedToolCallIds"] == [{"index": 1, "from": "call_0", "to": "call_0_2"}]
    assistant = entries[finished["entryId"]]["message"]
    ids = [b["id"] for b in assistant["content"] if b["type"] == "toolCall"]
    assert ids == ["call_0", "call_0_2"]
    started = [r for r in records if r["type"] == "tool_started"]
    assert [r["callKey"] for r in started] == [
        f"{finished['entryId']}/0",
        f"{finished['entryId']}/1",
    ]
    assert len({r["idempotencyKey"] for r in started}) == 2
    results = [
        e["message"]["toolCallId"]
        for e in entries.values()
        if e["type"] == "message" and e["message"]["role"] == "toolResult"
    ]
    assert sorted(results) == ["call_0", "call_0_2"]


@pytest.mark.crash
@pytest.mark.parametrize("point", ["after_tool_started:1", "after_tool_effect:1"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_ids_crash_mid_batch(backend: str, point: str, tmp_path: Path) -> None:
    """A crash inside the batch: the plan names two calls by two keys; an operator decides
    each in-doubt one from the effects file; after resume each effect happened exactly once."""
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    script = write_script(tmp_path / "s.json", TWO_SAME_IDS)
    first = dh(
        "run", "go", "--provider", f"scripted:{script}", "--store", spec, "--cwd", str(work),
        crash_at=point,
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    sid = session_id(first)
    lane = main_lane(plan_json(sid, spec))
    calls = lane["tool_calls"]
    assert [c["tool_call_id"] for c in calls] == ["call_0", "call_0_2"]
    assert len({c["call_key"] for c in calls}) == 2
    assert "in_doubt" in {c["status"] for c in calls}
    decide = []
    for c in calls:
        if c["action"] == "await_decision":
            tag = c["arguments"]["content"].strip()
            value = f"result:{tag} applied" if effects(work)[tag] else "retry"
            decide += ["--decide", f"{c['call_key']}={value}"]
    resumed = dh("resume", sid, "--store", spec, "--quiet", *decide)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert effects(work) == {"a": 1, "b": 1}


def test_legacy_records_with_repeated_ids_pair_in_order() -> None:
    """Records written before call keys (toolCallId only) on a turn whose two calls share an
    id: the first intent and settlement belong to the first call, the next intent to the
    second; the second is never planned ``not_started`` again after its intent."""
    from durable_harness.recovery.decide import plan

    log = Log().start().answer(("c1", "append_file"), ("c1", "append_file"))
    log.started("c1", "append_file", "never").finished("c1")
    lane = plan(log.snapshot(), TOOLS).lane("main")
    assert [(c.status, c.action) for c in lane.tool_calls] == [
        ("completed", "none"),
        ("not_started", "execute"),
    ]
    log.started("c1", "append_file", "never")
    lane = plan(log.snapshot(), TOOLS).lane("main")
    assert [(c.status, c.action) for c in lane.tool_calls] == [
        ("completed", "none"),
        ("in_doubt", "await_decision"),
    ]


def test_a_decision_by_an_ambiguous_id_is_refused() -> None:
    from durable_harness.errors import RecoveryError
    from durable_harness.recovery.decide import plan

    log = Log().start().answer(("c1", "append_file"), ("c1", "append_file"))
    log.started("c1", "append_file", "never").started("c1", "append_file", "never")
    with pytest.raises(RecoveryError, match="a1/0, a1/1"):
        plan(log.snapshot(), TOOLS, decisions={"c1": {"decision": "fail"}})
    lane = plan(log.snapshot(), TOOLS, decisions={"a1/1": {"decision": "fail"}}).lane("main")
    assert [c.action for c in lane.tool_calls] == ["await_decision", "apply_decision"]


def test_tool_started_naming_no_call_is_damage() -> None:
    from durable_harness.recovery.decide import plan

    log = Log().start().answer(("c1", "append_file"))
    log.started("zz", "append_file", "never")
    p = plan(log.snapshot(), TOOLS)
    kinds = [(d["kind"], d["seq"]) for d in p.damage]
    assert ("unknown_call", log.seq) in kinds
    assert p.damaged
    (call,) = p.lane("main").tool_calls
    # the lost intent may have been this call's: it waits for a decision
    assert (call.status, call.doubt, call.action) == ("in_doubt", "damaged_log", "await_decision")


def test_record_of_an_unknown_run_is_damage() -> None:
    from durable_harness.recovery.decide import plan

    log = Log().start()
    log.rec("tool_started", run_id="ghost", toolCallId="x", toolName="bash")
    p = plan(log.snapshot(), TOOLS)
    assert [d["kind"] for d in p.damage] == ["unknown_run"]


LOOPING = [
    {"text": f"turn {i}", "tool_calls": [
        {"name": "append_file", "arguments": {"path": "effects.log", "content": f"t{i}a\n"}},
        {"name": "append_file", "arguments": {"path": "effects.log", "content": f"t{i}b\n"}},
    ]}
    for i in range(1, 30)
]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_tool_call_bound_fails_the_run_before_the_extra_calls(backend: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    opts = HarnessOptions(max_tool_calls=5)

    async def go() -> tuple[str, str]:
        with Session(open_store(spec).create_session(str(work))) as s:
            async with Harness(s, ScriptedProvider(LOOPING), builtin_tools(), options=opts) as h:
                handle = await h.prompt("loop")
                return await handle.wait(), s.id

    outcome, sid = anyio.run(go)
    assert outcome == "failed"
    # turns 1 and 2 ran their 4 calls; turn 3 would make 6 > 5: none of its calls ran
    assert set(effects(work)) == {"t1a", "t1b", "t2a", "t2b"}
    records, _entries, _ = read_session(spec, sid)
    (started,) = [r for r in records if r["type"] == "run_started"]
    assert started["limits"]["maxToolCalls"] == 5
    (finished,) = [r for r in records if r["type"] == "run_finished"]
    assert finished["reason"].startswith("max_tool_calls 5 reached")
    assert finished["limit"] == "max_tool_calls"
    not_run = [r for r in records if r["type"] == "tool_finished" and r["outcome"] == "not_run"]
    assert len(not_run) == 2  # the transcript stays well-formed: every call has a result


def test_recorded_limits_govern_a_resumed_run() -> None:
    """The plan reads the limits from ``run_started``, not from today's defaults."""
    from durable_harness.recovery.decide import plan

    log = Log().start(maxTurns=1).answer(("c1", "read_file"))
    log.started("c1", "read_file", "safe").finished("c1")
    log.rec("save_point", turn=1)
    lp = plan(log.snapshot(), TOOLS).lane("main")
    assert (lp.next_action, lp.reason) == ("fail_run_limit", "max_turns 1 reached")
    assert lp.step().limit == "max_turns"  # the typed stop cause the resumed run records
