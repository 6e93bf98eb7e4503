"""Every crash point of the brief, on both backends, end to end through the CLI: a real child
process (forked from the warm fork server: ``helpers.dh``) SIGKILLs itself at the point,
``recover --json`` prints the plan, another child ``resume``s (with operator decisions where the
plan waits for one) to the run's end, and the invariants hold: no accepted input lost, no
replay-never effect twice, exactly one result per tool call, a clean ``fsck``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from durable_harness.session.context import INTERRUPTED_TEXT

from .helpers import (
    BACKENDS,
    context_json,
    dh,
    effects,
    env,
    main_lane,
    plan_in_process,
    plan_json,
    read_session,
    results_per_call,
    session_id,
    store_spec,
    write_script,
)

PROMPT = "deploy t1 and a1"

# turn 1 asks for two replay-never tools at once; each leaves a tag in effects.log
TURNS: list[dict[str, Any]] = [
    {
        "text": "Recording both.",
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "echo t1 >> effects.log"}},
            {"name": "append_file", "arguments": {"path": "effects.log", "content": "a1\n"}},
        ],
        "usage": {"input": 100, "output": 20},
    },
    {"text": "Both recorded once.", "usage": {"input": 140, "output": 10}},
]
TAGS = {"bash": "t1", "append_file": "a1"}

# point -> (next_action, sorted statuses of the turn's tool calls in the plan)
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "after_run_started": ("issue_provider_request", []),
    "after_provider_request_started": ("reissue_provider_request", []),
    "mid_provider_stream": ("reissue_provider_request", []),
    "after_assistant_entry": ("resume_tool_calls", ["not_started", "not_started"]),
    "after_tool_started": ("await_decision", ["in_doubt", "not_started"]),
    "after_tool_effect": ("await_decision", ["in_doubt", "in_doubt"]),
    "after_tool_finished": ("await_decision", ["completed", "in_doubt"]),
    # before_save_point is gone from a tool turn: the last settlement, the save point and the
    # next provider request are one commit (design/crash-matrix.md, "Merged commits"); the
    # crash after that commit is the next request's, re-issued with both calls completed
    "after_provider_request_started:2": ("reissue_provider_request", ["completed", "completed"]),
    "before_run_finished": ("finish_run", []),
}

# the abort point needs a client that aborts while the tool runs: a small library child
ABORT_CHILD = textwrap.dedent(
    """
    import sys

    import anyio

    from durable_harness.harness.harness import Harness, HarnessOptions
    from durable_harness.providers.scripted import ScriptedProvider
    from durable_harness.session.session import Session
    from durable_harness.storage import open_store
    from durable_harness.tools.builtin import builtin_tools

    spec, cwd, script, prompt = sys.argv[1:5]


    async def main() -> str:
        session = Session(open_store(spec).create_session(cwd))
        print(f"session {session.id}", file=sys.stderr, flush=True)
        opts = HarnessOptions(provider_spec=f"scripted:{script}")
        with session:
            provider = ScriptedProvider.from_file(script)
            async with Harness(session, provider, builtin_tools(), cwd=cwd, options=opts) as h:
                async with anyio.create_task_group() as tg:

                    def on_event(event):
                        if event["type"] == "tool_execution_start":
                            tg.start_soon(h.abort)

                    h.subscribe(on_event)
                    handle = await h.prompt(prompt)
                    return await handle.wait()


    print("run", anyio.run(main), file=sys.stderr)
    """
)

ABORT_TURNS: list[dict[str, Any]] = [
    {
        "text": "Long job.",
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "echo b1 >> effects.log; sleep 1"}}
        ],
    },
    {"text": "unreachable"},
]


def _fsck_ok(location: str) -> None:
    proc = dh("fsck", location, "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report
    assert report["ok"] is True
    assert report["damage"] == []


def _decide(lane: dict[str, Any], work: Path) -> list[str]:
    """The operator's decisions: ``result:`` when the effect is visible, else ``retry``."""
    seen = effects(work)
    args: list[str] = []
    for c in lane["tool_calls"]:
        if c["action"] != "await_decision":
            continue
        tag = TAGS[c["tool_name"]]
        value = f"result:already applied ({tag} in effects.log)" if seen[tag] else "retry"
        args += ["--decide", f"{c['tool_call_id']}={value}"]
    return args


def _common_checks(spec: str, sid: str, outcome: str, prompt: str) -> list[dict[str, Any]]:
    records, entries, location = read_session(spec, sid)
    (started,) = [r for r in records if r["type"] == "run_started"]
    finished = [r for r in records if r["type"] == "run_finished"]
    assert [r["outcome"] for r in finished] == [outcome]
    # no accepted input lost: the prompt entry is in the tree, with its text
    prompt_entry = entries[str(started["promptEntryId"])]
    assert prompt_entry["message"]["content"][0]["text"] == prompt
    messages = context_json(sid, spec)
    assert messages[0]["role"] == "user"
    assert messages[0]["content"][0]["text"] == prompt
    # every tool call has exactly one result, and none is the synthetic "interrupted" one
    per_call = results_per_call(messages)
    assert all(n == 1 for n in per_call.values()), per_call
    for m in messages:
        if m["role"] == "toolResult":
            assert INTERRUPTED_TEXT not in json.dumps(m["content"])
        if m["role"] == "assistant":
            assert m["content"], "an empty assistant message reached the context"
    # no lane left with an open run: the plan says idle
    assert main_lane(plan_in_process(spec, sid))["state"] == "idle"
    if location.endswith(".jsonl"):
        _fsck_ok(location)
    return messages


# Every point through the CLI on JSONL; on SQLite the point where both calls are in doubt. The
# matrix (tests/crashtest) crashes every scenario at every point on both backends; this file is
# the CLI's door (recover --json, resume --decide, context, fsck), which does not depend on the
# backend, so it does not repeat the matrix's cells on each (issue 22, "The suite").
CASES = [(point, "jsonl") for point in EXPECTED] + [("after_tool_effect", "sqlite")]


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("point", "backend"), CASES)
def test_crash_point_recovers(point: str, backend: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    script = write_script(tmp_path / "script.json", TURNS)

    provider = f"scripted:{script}"
    first = dh(
        "run", PROMPT, "--provider", provider, "--store", spec, "--cwd", str(work), crash_at=point
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    sid = session_id(first)

    lane = main_lane(plan_json(sid, spec))
    want_next, want_statuses = EXPECTED[point]
    assert lane["state"] == "suspended"
    assert lane["reason"] == ("awaiting_decision" if want_next == "await_decision" else "crash")
    assert lane["next_action"] == want_next
    assert lane["abort_requested"] is False
    assert lane["run_id"]
    assert sorted(c["status"] for c in lane["tool_calls"]) == want_statuses
    for c in lane["tool_calls"]:
        assert c["replay"] == "never"
        if c["status"] == "in_doubt":
            assert c["action"] == "await_decision"  # replay never, no reconcile hook
        elif c["status"] == "not_started":
            assert c["action"] == "execute"
    if point in ("after_provider_request_started", "mid_provider_stream"):
        assert lane["attempts"] == {"turn 1": 1}
        assert lane["cost_unknown_attempts"] == 1
    # recover only looks: nothing ran, the plan is the same a second time
    before = effects(work)
    assert main_lane(plan_in_process(spec, sid)) == lane
    assert effects(work) == before

    decide = _decide(lane, work)
    assert bool(decide) == (want_next == "await_decision")
    resumed = dh("resume", sid, "--store", spec, *decide)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "lane main: completed" in resumed.stdout
    decided = [r for r in read_session(spec, sid)[0] if r["type"] == "decision"]
    assert len(decided) == len(decide) // 2
    assert all(r["author"] == "cli" for r in decided)  # the door that decided is on record

    assert effects(work) == {"t1": 1, "a1": 1}
    messages = _common_checks(spec, sid, "completed", PROMPT)
    assert messages[-1]["role"] == "assistant"
    assert messages[-1]["content"][0]["text"] == "Both recorded once."


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_crash_after_abort_requested(backend: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    script = write_script(tmp_path / "script.json", ABORT_TURNS)
    child = tmp_path / "abort_child.py"
    child.write_text(ABORT_CHILD)

    first = subprocess.run(
        [sys.executable, str(child), spec, str(work), str(script), "long job"],
        env=env("after_abort_requested"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    sid = session_id(first)

    lane = main_lane(plan_json(sid, spec))
    assert lane["state"] == "suspended"
    assert lane["abort_requested"] is True
    assert lane["next_action"] == "settle_aborted"
    (call,) = lane["tool_calls"]
    assert (call["tool_name"], call["status"], call["action"]) == ("bash", "in_doubt", "abort")

    resumed = dh("resume", sid, "--store", spec)
    assert resumed.returncode == 3, resumed.stdout + resumed.stderr  # EXIT["aborted"]
    assert "lane main: aborted" in resumed.stdout

    # the aborted bash is never run again by recovery (its own first run may or may not
    # have got as far as the echo before the kill)
    assert effects(work)["b1"] <= 1
    messages = _common_checks(spec, sid, "aborted", "long job")
    (result,) = [m for m in messages if m["role"] == "toolResult"]
    assert result["isError"] is True
    assert "abort" in json.dumps(result["content"]).lower()
    assert "unreachable" not in json.dumps(messages)


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_retry_killed_again_waits_for_a_new_decision(tmp_path: Path) -> None:
    """A ``retry`` decision covers one re-execution: when that one is killed too, the call is
    in doubt again and recovery asks again instead of running the tool a third time."""
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec("jsonl", tmp_path)
    script = write_script(tmp_path / "script.json", [TURNS[0], TURNS[1]])
    provider = f"scripted:{script}"
    first = dh(
        "run", PROMPT, "--provider", provider, "--store", spec, "--cwd", str(work),
        crash_at="after_tool_effect",
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    sid = session_id(first)
    lane = main_lane(plan_json(sid, spec))
    retry = [
        arg
        for c in lane["tool_calls"]
        if c["action"] == "await_decision"
        for arg in ("--decide", f"{c['tool_call_id']}=retry")
    ]
    assert retry
    # the operator says retry, and the resume dies at the same point again
    again = dh("resume", sid, "--store", spec, *retry, crash_at="after_tool_effect")
    assert again.returncode == -signal.SIGKILL, again.stderr
    lane = main_lane(plan_json(sid, spec))
    assert lane["next_action"] == "await_decision"
    waiting = [c for c in lane["tool_calls"] if c["action"] == "await_decision"]
    assert waiting
    assert all(c["attempts"] == 2 for c in waiting)
    applied = effects(work)
    # a plain resume (no new decision) must not run them a third time
    plain = dh("resume", sid, "--store", spec)
    assert plain.returncode == 5, plain.stdout + plain.stderr  # EXIT["suspended"]
    assert effects(work) == applied


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["fail-in-doubt", "retry-safe"])
def test_resume_with_policy_needs_no_decision(policy: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec("sqlite", tmp_path)
    script = write_script(tmp_path / "script.json", TURNS)
    provider = f"scripted:{script}"
    first = dh(
        "run", PROMPT, "--provider", provider, "--store", spec, "--cwd", str(work),
        crash_at="after_tool_started",
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    sid = session_id(first)
    lane = main_lane(plan_json(sid, spec, "--policy", policy))
    actions = {c["tool_name"]: (c["status"], c["action"]) for c in lane["tool_calls"]}
    assert actions == {"bash": ("in_doubt", "fail"), "append_file": ("not_started", "execute")}
    assert lane["next_action"] == "resume_tool_calls"

    resumed = dh("resume", sid, "--store", spec, "--policy", policy)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # the in-doubt bash (its effect never began) is failed, not run; the other call runs once
    assert effects(work) == {"a1": 1}
    messages = _common_checks(spec, sid, "completed", PROMPT)
    (bash_call,) = [
        b["id"]
        for m in messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b.get("type") == "toolCall" and b["name"] == "bash"
    ]
    (result,) = [m for m in messages if m.get("toolCallId") == bash_call]
    assert result["isError"] is True
    assert "not retried" in json.dumps(result["content"])


def _processes_with(marker: str) -> list[int]:
    """Pids of this user's processes whose environment holds ``marker`` (``/proc``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if marker.encode() in environ.split(b"\0"):
            found.append(int(proc.name))
    return found


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bash_spawned_but_unrecorded_never_runs_its_command(backend: str, tmp_path: Path) -> None:
    """SIGKILL between bash's spawn and its ``tool_process`` record: the start gate sees the
    harness gone and exits, so the command never runs unseen; the call is in doubt and a retry
    runs it once."""
    work = tmp_path / "work"
    work.mkdir()
    spec = store_spec(backend, tmp_path)
    turns = [
        {
            "text": "Deploying.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "echo t1 >> effects.log"}}],
        },
        {"text": "Deployed once."},
    ]
    script = write_script(tmp_path / "script.json", turns)
    first = dh(
        "run",
        PROMPT,
        "--provider",
        f"scripted:{script}",
        "--store",
        spec,
        "--cwd",
        str(work),
        crash_at="after_tool_spawned",
    )
    assert first.returncode == -signal.SIGKILL, (first.returncode, first.stderr)
    sid = session_id(first)
    lane = main_lane(plan_json(sid, spec))
    assert lane["next_action"] == "await_decision"
    (call,) = lane["tool_calls"]
    assert call["status"] == "in_doubt"
    records, _entries, _loc = read_session(spec, sid)
    assert not [r for r in records if r["type"] == "tool_process"]
    # the shell the dead harness spawned is gone without running the command
    marker = f"DURABLE_HARNESS_TOOL_CALL_ID={call['tool_call_id']}"
    deadline = time.monotonic() + 30
    while _processes_with(marker):
        assert time.monotonic() < deadline, "the spawned shell outlived its harness"
        time.sleep(0.05)
    assert effects(work) == {}
    resumed = dh("resume", sid, "--store", spec, "--decide", f"{call['tool_call_id']}=retry")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert effects(work) == {"t1": 1}
