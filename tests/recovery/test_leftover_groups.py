"""A ``bash`` process group left running by a SIGKILLed harness is killed before recovery
settles its call, whatever the settlement (``design/recovery.md``, "Process groups left
running"): an aborted run settled on resume, a call failed by decision.

The command writes ``x``, holds until a ``gate`` file exists, then writes ``y``: the group is
alive (the effect may still land) until recovery kills it. After ``resume`` the group must be
gone and, once the gate opens, ``y`` must never appear. The kill is part of the plan
(``kills_group``: "resume kills it first"), so the log's witness of the plan
(:func:`~durable_harness.recovery.audit.plan_followed`) accepts it, and only it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.recovery.audit import plan_followed
from durable_harness.recovery.decide import LanePlan, RecoveryPlan, ToolCallPlan
from durable_harness.recovery.resume import plan_recovery, resume_session
from durable_harness.session.session import Session
from durable_harness.storage import open_store
from durable_harness.tools.builtin import builtin_tools
from durable_harness.tools.processes import group_alive

from .helpers import BACKENDS, dh, env, main_lane, plan_json, read_session, store_spec, write_script

COMMAND = "echo x >> effect; while [ ! -e gate ]; do sleep 0.02; done; echo y >> effect"
TURNS: list[dict[str, Any]] = [
    {"text": "Long job.", "tool_calls": [{"name": "bash", "arguments": {"command": COMMAND}}]},
    {"text": "Done."},
]
DEADLINE = 30.0

# A harness that runs the prompt and, once the command's first effect is on disk, aborts
# (with DURABLE_HARNESS_CRASH_AT=after_abort_requested it SIGKILLs itself there) or, with
# "hold", just waits to be killed by the test.
CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import anyio

    from durable_harness.harness.harness import Harness, HarnessOptions
    from durable_harness.providers.scripted import ScriptedProvider
    from durable_harness.session.session import Session
    from durable_harness.storage import open_store
    from durable_harness.tools.builtin import builtin_tools

    spec, cwd, script, verb = sys.argv[1:5]


    async def main() -> None:
        session = Session(open_store(spec).create_session(cwd))
        print(f"session {session.id}", file=sys.stderr, flush=True)
        opts = HarnessOptions(provider_spec=f"scripted:{script}")
        with session:
            provider = ScriptedProvider.from_file(script)
            async with Harness(session, provider, builtin_tools(), cwd=cwd, options=opts) as h:
                await h.prompt("go")
                effect = Path(cwd) / "effect"
                while not (effect.exists() and effect.read_text() == "x\\n"):
                    await anyio.sleep(0.02)
                if verb == "abort":
                    await h.abort()
                print("effect seen", file=sys.stderr, flush=True)
                await anyio.sleep_forever()


    anyio.run(main)
    """
)


def _until(what: str, probe: Any) -> Any:
    """Poll ``probe`` until it returns something truthy (deadline: ``DEADLINE``)."""
    end = time.monotonic() + DEADLINE
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE:.0f} s waiting for {what}")
        time.sleep(0.02)


def _crashed_child(tmp_path: Path, backend: str, verb: str) -> tuple[str, str, Path]:
    """Run the child until it is SIGKILLed (by its crash point for ``abort``, by the test for
    ``hold``) with the command's group alive; return ``(spec, session id, work dir)``."""
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    script = write_script(tmp_path / "script.json", TURNS)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(child), spec, str(work), str(script), verb],
        env=env("after_abort_requested" if verb == "abort" else None),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if verb == "hold":
            _until("the first effect", lambda: (work / "effect").exists())
            _until("x", lambda: (work / "effect").read_text() == "x\n")
            proc.send_signal(signal.SIGKILL)
        assert proc.wait(DEADLINE) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    sid = err.split("session ", 1)[1].split()[0]
    return spec, sid, work


def _group(spec: str, sid: str) -> tuple[int, int | None]:
    """The recorded process group of the session's one bash call."""
    records, _, _ = read_session(spec, sid)
    (rec,) = [r for r in records if r["type"] == "tool_process"]
    return int(rec["pgid"]), rec.get("startTime")


def _no_second_effect(work: Path, group: tuple[int, int | None]) -> None:
    """The group is gone; opening the gate lets nothing write ``y``."""
    assert not group_alive(*group), "recovery settled the call with its process group alive"
    (work / "gate").touch()
    assert (work / "effect").read_text() == "x\n"


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_of_an_aborted_run_kills_the_leftover_group(backend: str, tmp_path: Path) -> None:
    spec, sid, work = _crashed_child(tmp_path, backend, "abort")
    group = _group(spec, sid)
    try:
        lane = main_lane(plan_json(sid, spec))
        assert lane["next_action"] == "settle_aborted"
        (call,) = lane["tool_calls"]
        assert call["action"] == "abort"
        assert call["process"]["alive"] is True  # recover only looks: the group still runs
        assert group_alive(*group)

        resumed = dh("resume", sid, "--store", spec)
        assert resumed.returncode == 3, resumed.stdout + resumed.stderr  # aborted
        _no_second_effect(work, group)
        records, _, _ = read_session(spec, sid)
        (finished,) = [r for r in records if r["type"] == "tool_finished"]
        assert finished["outcome"] == "aborted"
    finally:
        (work / "gate").touch()


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_failing_an_in_doubt_call_kills_its_leftover_group_first(tmp_path: Path) -> None:
    spec, sid, work = _crashed_child(tmp_path, "sqlite", "hold")
    group = _group(spec, sid)
    try:
        lane = main_lane(plan_json(sid, spec))
        (call,) = lane["tool_calls"]
        assert (call["action"], call["process"]["alive"]) == ("await_decision", True)
        decided = dh("resume", sid, "--store", spec, "--decide", f"{call['call_key']}=fail")
        assert decided.returncode == 0, decided.stdout + decided.stderr
        _no_second_effect(work, group)
        records, _, _ = read_session(spec, sid)
        outcomes = [r["outcome"] for r in records if r["type"] == "tool_finished"]
        assert outcomes == ["failed_by_policy"] or outcomes == ["decided_fail"], outcomes
    finally:
        (work / "gate").touch()


def _resume_audited(
    spec: str, sid: str, work: Path, decide: str | None
) -> tuple[RecoveryPlan, list[dict[str, Any]]]:
    """Plan (with ``decide`` for the one call, if given) and resume by that plan through the
    library, as the crash matrix does; return the plan and the records the resume wrote."""
    tools = builtin_tools()
    with Session(open_store(spec).open_session(sid)) as session:

        async def go() -> tuple[RecoveryPlan, list[dict[str, Any]]]:
            first = await plan_recovery(session.store, tools, cwd=str(work))
            (call,) = first.plan.lane("main").tool_calls
            decisions = {call.call_key: {"decision": decide}} if decide else None
            rec = await plan_recovery(session.store, tools, decisions=decisions, cwd=str(work))
            before = session.store.last_seq()
            await resume_session(session, tools, decisions=decisions, recovery=rec)
            return rec.plan, session.store.records(since_seq=before)

        return anyio.run(go)


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("verb", "decide", "action", "outcome"),
    [("abort", None, "abort", "aborted"), ("hold", "fail", "apply_decision", "decided_fail")],
)
def test_the_kill_of_a_leftover_group_is_the_plans(
    tmp_path: Path, verb: str, decide: str | None, action: str, outcome: str
) -> None:
    """The crash matrix's ``plan`` check failed on the abort scenario whenever the crash left
    the bash group running (``batch``: the abort's barrier let the command start): resume
    killed it, as the plan said, but the audit took ``tool_process_killed`` for the call's
    action."""
    spec, sid, work = _crashed_child(tmp_path, "sqlite", verb)
    group = _group(spec, sid)
    try:
        plan, after = _resume_audited(spec, sid, work, decide)
        (call,) = plan.lane("main").tool_calls
        assert (call.action, call.kills_group) == (action, True)
        kinds = [
            (r["type"], r.get("outcome") or r.get("by"))
            for r in after
            if r["type"] in ("tool_process_killed", "tool_finished")
        ]
        assert kinds == [("tool_process_killed", "resume"), ("tool_finished", outcome)]
        assert plan_followed(plan, after) == []
        _no_second_effect(work, group)
    finally:
        (work / "gate").touch()


def test_a_kill_the_plan_did_not_announce_is_reported() -> None:
    """The audit accepts resume's kill only for a call whose plan said its group was alive
    here (``kills_group``); a kill of any other call's group is a step the plan never showed."""
    call: dict[str, Any] = {"lane": "main", "runId": "r", "callKey": "e/0", "toolCallId": "c1"}
    killed = {"type": "tool_process_killed", **call, "pgid": 4242, "by": "resume"}
    finished = {"type": "tool_finished", **call, "outcome": "aborted"}
    ended = {"type": "run_finished", "lane": "main", "runId": "r", "outcome": "aborted"}

    def plan_with(process: dict[str, Any] | None) -> RecoveryPlan:
        planned = ToolCallPlan("c1", "bash", "in_doubt", "never", "abort", "e/0", process=process)
        lane = LanePlan("main", "suspended", "r", True, "settle_aborted", [planned])
        return RecoveryPlan("s", [lane], [])

    alive = {"pgid": 4242, "startTime": 7, "alive": True}
    assert plan_followed(plan_with(alive), [killed, finished, ended]) == []
    assert plan_followed(plan_with(alive), [finished, ended]) == []  # it ended by itself
    for process in (None, {**alive, "alive": False}, {**alive, "pgid": 4343}):
        assert plan_followed(plan_with(process), [killed, finished, ended]) == [
            "lane main call c1 (e/0): planned abort, log shows tool_process_killed"
        ], process


def test_recorded_group_refuses_our_own_and_inits_group() -> None:
    """A hand-edited pgid of 0 or 1 is never taken for a group (killpg(0) is our own)."""
    from durable_harness.harness.groups import kill_groups, recorded_group
    from durable_harness.harness.state import ToolCallState

    for pgid in (0, 1, -5, True, "12"):
        call = ToolCallState("a/0", "c1", "bash", {}, status="in_doubt")
        call.process = {"pgid": pgid, "startTime": None}
        assert recorded_group(call) is None
        assert kill_groups([call], "s") == []
