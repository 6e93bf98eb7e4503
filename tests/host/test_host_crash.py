"""The host SIGKILLed mid-tool with 20 sessions running, then restarted (issue 12, "Must show").

A child host (:mod:`.host_child`) creates 20 sessions whose tool calls (``bash`` and
``append_file``: replay ``never``; ``read_file``: replay ``safe``) are held open by a gate file;
once every call's ``tool_started`` intent is durable (polled read-only from the store), the test
SIGKILLs it. A second child dies by SIGKILL at ``after_assistant_entry``: its call was killed
before its intent. Then a new :class:`SessionManager` on the same store, with
``auto_resume="no_decision"``, must show each session suspended with its plan (the replay-never
calls in doubt) or resumed by policy (the replay-safe calls, the not-started call); every in-doubt
call is decided through the manager (retry, fail, result:TEXT) and every run finishes. Each
effect is a line in a per-session file: a call that was not retried by decision ran once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from durable_harness.host import SessionManager
from durable_harness.storage import open_store

from .host_child import GATE, effect_path, kind, options, write_script

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(180)]

N = 20
NOT_STARTED = N  # the index of the session killed before its call's intent
CHILD = Path(__file__).with_name("host_child.py")
DEADLINE = 60.0
DECISIONS = ("retry", "fail", "result:checked by hand")

T = TypeVar("T")


@pytest.fixture
def anyio_backend() -> str:
    """The restarted host runs on asyncio (the harness tests cover trio)."""
    return "asyncio"


def poll(what: str, probe: Callable[[], T | None], child: subprocess.Popen[bytes] | None) -> T:
    """Call ``probe`` until it returns something other than ``None`` (deadline: ``DEADLINE``)."""
    end = time.monotonic() + DEADLINE
    while True:
        value = probe()
        if value is not None:
            return value
        if child is not None and child.poll() is not None:
            err = child.stderr.read().decode() if child.stderr else ""
            raise AssertionError(f"child exited {child.returncode} while waiting for {what}: {err}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE:.0f} s waiting for {what}")
        time.sleep(0.05)


def spawn(
    args: list[str], work: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a child host (stdout and stderr piped)."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        cwd=work,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def records(spec: str, session_id: str, *types: str) -> list[dict[str, Any]]:
    """The session's records of ``types``, read without the writer lease."""
    with open_store(spec).open_session(session_id, write=False) as store:
        return store.records(None, types=types or None)


def lines(work: Path, index: int) -> int:
    """How many effects session ``index``'s tool call has had."""
    path = effect_path(work, index)
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
@pytest.mark.anyio
async def test_host_sigkilled_mid_tool_restarts_with_plans_and_no_silent_replay(
    tmp_path: Path, backend: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = f"jsonl:{tmp_path}/store" if backend == "jsonl" else f"sqlite:{tmp_path}/host.db"
    script = tmp_path / "script.json"
    write_script(script, work, N + 1)

    # 1. Twenty sessions, every tool call held open after its intent.
    host = spawn(["hold", spec, str(work), str(script), str(N)], work)
    try:
        ids: dict[int, str] = poll(
            "the child's session ids",
            lambda: (
                {int(k): v for k, v in json.loads((work / "ids.json").read_text()).items()}
                if (work / "ids.json").exists()
                else None
            ),
            host,
        )

        def all_held() -> bool | None:
            for i, sid in ids.items():
                if not records(spec, sid, "tool_started"):
                    return None
                if kind(i) != "read" and lines(work, i) != 1:
                    return None  # the effect of a replay-never call is done, the call open
            return True

        poll("20 tool_started intents and effects", all_held, host)

        # 2. A second host dies by SIGKILL between an assistant message and its call's intent.
        one = spawn(
            ["one", spec, str(work), str(script), str(NOT_STARTED)],
            work,
            env={"DURABLE_HARNESS_CRASH_AT": "after_assistant_entry"},
        )
        try:
            assert one.wait(DEADLINE) == -signal.SIGKILL, one.stderr.read() if one.stderr else ""
        finally:
            if one.poll() is None:
                one.kill()
        ids[NOT_STARTED] = (work / f"id-{NOT_STARTED:02d}").read_text()
        assert records(spec, ids[NOT_STARTED], "provider_request_finished")
        assert not records(spec, ids[NOT_STARTED], "tool_started")
        assert lines(work, NOT_STARTED) == 0

        # 3. SIGKILL the first host with all 20 calls in flight.
        assert host.poll() is None, "the host died before it was killed"
        os.killpg(host.pid, signal.SIGKILL)
        assert host.wait(DEADLINE) == -signal.SIGKILL
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait()
        # The orphaned bash calls end; a retried call runs through; nothing is held any more.
        (work / GATE).touch()
    for i in range(N):
        assert not records(spec, ids[i], "tool_finished"), f"session {i} settled before the kill"

    # 4. Restart: reconciliation suspends every session; those needing no decision resume, in
    # the background once the manager is entered (design/host.md, "Start-up reconciliation").
    async with SessionManager(spec, options(script, auto_resume="no_decision")) as manager:
        await manager.wait_resumed()
        decided: dict[int, str] = {}
        for i, sid in ids.items():
            rec = await manager.get(sid)
            if i == NOT_STARTED or kind(i) == "read":
                assert rec.state in ("running", "idle"), (i, rec)
                assert rec.generation >= 2, (i, rec.generation)  # a new generation runs it
                continue
            assert rec.state == "suspended", (i, rec)
            status = await manager.status(sid)
            assert status["state"] == "suspended" and status["plan"] is not None
            plan = manager.plan(sid)
            assert plan is not None
            waiting = [c for lane in plan.lanes for c in lane.waiting()]
            assert len(waiting) == 1 and waiting[0].status == "in_doubt", (i, plan.to_json())
            assert waiting[0].replay == "never"
            decision = DECISIONS[len(decided) % len(DECISIONS)]
            decided[i] = decision
            await manager.decide(sid, waiting[0].tool_call_id, decision)

        assert set(decided.values()) == set(DECISIONS)

        async def finished(sid: str) -> None:
            with anyio.fail_after(DEADLINE):
                while (await manager.get(sid)).state != "idle":
                    await anyio.sleep(0.05)

        async with anyio.create_task_group() as tg:
            for sid in ids.values():
                tg.start_soon(finished, sid)

    # 5. Every run finished; every effect happened once, plus once per decided retry.
    for i, sid in ids.items():
        ends = records(spec, sid, "run_finished")
        assert [r.get("outcome") for r in ends] == ["completed"], (i, ends)
        starts = records(spec, sid, "tool_started")
        retried = decided.get(i) == "retry"
        if kind(i) == "read":
            assert len(starts) == 2, (i, starts)  # replay-safe: re-run by recovery
            assert lines(work, i) == 0
        elif i == NOT_STARTED:
            assert len(starts) == 1 and lines(work, i) == 1, (i, starts)
        else:
            assert len(starts) == 1 + retried, (i, decided.get(i), starts)
            assert lines(work, i) == 1 + retried, (i, decided.get(i))
        results = [r for r in records(spec, sid, "tool_finished") if r.get("toolCallId")]
        assert len(results) == 1, (i, results)
        if decided.get(i, "").startswith("result:"):
            assert results[0]["outcome"] == "decided_result"
        elif decided.get(i) == "fail":
            assert results[0]["outcome"] == "decided_fail"
