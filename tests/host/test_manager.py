"""The session manager on a real JSONL store: lifecycle verbs, staged close, failed starts,
start-up reconciliation of runs a real SIGKILL interrupted (``design/host.md``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.crashtest import forkserver
from durable_harness.errors import (
    DurableHarnessError,
    IllegalTransition,
    InvalidRequest,
    MessageTooLarge,
    RunInProgress,
    SessionLive,
    SessionNotFound,
    SessionNotLive,
)
from durable_harness.host import HostOptions, SessionManager
from durable_harness.host.lifecycle import STATES, TRANSITIONS, check, reconciled
from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "script.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def workdir(tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return str(work)


async def until(check_fn: Callable[[], Awaitable[bool]], what: str, limit: float = 20.0) -> None:
    """Poll ``check_fn`` until it is true, failing after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await check_fn():
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def state_is(m: SessionManager, sid: str, *states: str) -> None:
    async def ok() -> bool:
        return (await m.get(sid)).state in states

    await until(ok, f"session {sid} to be {'/'.join(states)}")


def records(spec: str, sid: str, *types: str) -> list[dict[str, Any]]:
    with open_store(spec).open_session(sid, write=False) as s:
        return s.records(None, types=types or None)


# -- the state machine ------------------------------------------------------------------------


def test_every_move_outside_the_table_is_refused() -> None:
    for old in STATES:
        for new in STATES:
            if new == old or new in TRANSITIONS[old]:
                assert check("s", old, new) == new
            else:
                with pytest.raises(IllegalTransition) as err:
                    check("s", old, new)
                assert err.value.code == "illegal_transition"
                assert err.value.details == {"session_id": "s", "from": old, "to": new}


def test_a_stored_live_state_without_its_owner_is_suspended() -> None:
    for stored in ("creating", "idle", "running"):
        assert reconciled(stored, owner_alive=False) == "suspended"
        assert reconciled(stored, owner_alive=True) == stored
    assert reconciled("closing", owner_alive=False) == "closed"
    for stored in ("closed", "suspended", "error"):
        assert reconciled(stored, owner_alive=False) == stored


# -- the verbs ----------------------------------------------------------------------------------


async def test_create_send_close_resume_forget(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    work = workdir(tmp_path)
    provider = script(tmp_path, [{"text": "hello"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.create(work)
        assert (rec.state, rec.generation, rec.cwd) == ("idle", 1, work)
        sent = await m.send(rec.id, "hi")
        await state_is(m, rec.id, "idle")
        page = m.messages(rec.id)
        assert page["total"] == 2 and page["entries"][1]["message"]["role"] == "assistant"

        with pytest.raises(SessionLive):
            await m.forget(rec.id)
        closed = await m.close(rec.id)
        assert closed.state == "closed"
        assert (await m.close(rec.id)).state == "closed"  # idempotent
        assert m.messages(rec.id)["total"] == 2  # the transcript is kept
        with pytest.raises(SessionNotLive):
            await m.send(rec.id, "again")

        resumed = await m.resume(rec.id)
        assert (resumed.id, resumed.generation, resumed.state) == (rec.id, 2, "idle")
        with pytest.raises(SessionLive):
            await m.resume(rec.id)
        await m.close(rec.id)
        path = Path(rec.transcript)
        assert path.exists()
        await m.forget(rec.id)
        assert not path.exists() and not Path(str(path) + ".lock").exists()
        with pytest.raises(SessionNotFound):
            await m.get(rec.id)
    assert sent["mode"] == "prompt" and sent["run_id"]


async def test_the_lifecycle_is_durable_in_the_session_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "hello"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.create(workdir(tmp_path), command_runtime="pipe", mode="batch")
        await m.close(rec.id)
        await m.resume(rec.id)
        await m.close(rec.id)
    got = [(r["state"], r["generation"]) for r in records(spec, rec.id, "session_lifecycle")]
    assert got == [(state, gen) for gen in (1, 2) for state in ("idle", "closing", "closed")]
    # `durable-harness log` shows each lifecycle state with the generation that entered it
    from durable_harness.cli.main import main

    assert main(["log", rec.id, "--store", spec]) == 0
    shown = [ln.split("session_lifecycle", 1)[1].strip() for ln in capsys.readouterr().out
             .splitlines() if "session_lifecycle" in ln]  # fmt: skip
    assert shown == [f"{state}, generation {gen}" for state, gen in got]
    async with SessionManager(spec, HostOptions(provider=provider)) as again:
        back = await again.get(rec.id)
        assert (back.state, back.generation, back.mode, back.provider) == (
            "closed",
            2,
            "batch",
            provider,
        )


async def test_idempotency_keys_create_and_send_once(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "hello"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        first = await m.create(workdir(tmp_path), client_key="create-1")
        again = await m.create(workdir(tmp_path), client_key="create-1")
        assert again.id == first.id
        assert len(open_store(spec).list_sessions()) == 1
        a = await m.send(first.id, "hi", client_key="send-1")
        await state_is(m, first.id, "idle")
        b = await m.send(first.id, "hi", client_key="send-1")
        assert b == {**a, "duplicate": True}
        await m.close(first.id)
    assert len(records(spec, first.id, "run_started")) == 1
    # a new manager finds the creation key in the log
    async with SessionManager(spec, HostOptions(provider=provider)) as m2:
        assert (await m2.create(workdir(tmp_path), client_key="create-1")).id == first.id


async def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "hello"}])
    work = workdir(tmp_path)
    async with SessionManager(spec, HostOptions(max_message_bytes=64)) as m:
        bad: list[dict[str, Any]] = [
            {"cwd": "relative/dir", "provider": provider},
            {"cwd": str(tmp_path / "missing"), "provider": provider},
            {"cwd": work, "provider": provider, "mode": "fast"},
            {"cwd": work, "provider": provider, "command_runtime": "telnet"},
            {"cwd": work},  # no provider at all
        ]
        for kwargs in bad:
            with pytest.raises(InvalidRequest):
                await m.create(**kwargs)
        with pytest.raises(DurableHarnessError):
            await m.create(work, provider="scripted:" + str(tmp_path / "nope.json"))
        assert open_store(spec).list_sessions() == []
        rec = await m.create(work, provider=provider)
        for message, error in (("", InvalidRequest), ("x" * 65, MessageTooLarge)):
            with pytest.raises(error):
                await m.send(rec.id, message)
        for sid in ("../../etc", "a" * 300, "x/y", ""):
            with pytest.raises(InvalidRequest):
                await m.get(sid)
        with pytest.raises(SessionNotFound):
            await m.get("0" * 36)
        await m.close(rec.id)
    assert records(spec, rec.id, "run_started") == []


async def test_a_prompt_while_a_turn_runs_is_refused_and_steering_is_taken(
    tmp_path: Path,
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    gate = tmp_path / "gate"
    provider = script(tmp_path, [{"text": "held", "wait_for": str(gate)}, {"text": "after"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.create(workdir(tmp_path))
        events = m.listen(rec.id)
        await m.send(rec.id, "first")
        assert (await m.get(rec.id)).state == "running"
        with pytest.raises(RunInProgress):
            await m.send(rec.id, "second")
        status = await m.status(rec.id)
        assert status["state"] == "running" and status["lanes"][0]["live"] is True
        item = await m.send(rec.id, "also this", mode="steer")
        assert item["item_id"]
        gate.touch()
        await state_is(m, rec.id, "idle")
        seen: list[dict[str, Any]] = []
        with anyio.fail_after(10):
            async for event in events:
                seen.append(event)
                if event["type"] == "run_end":
                    break
        ids = [e["eventId"] for e in seen]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        types = [e["type"] for e in seen]
        assert types[0] in ("lifecycle", "run_start") and types[-1] == "run_end"
        assert seen[-1]["outcome"] == "completed"
        await m.close(rec.id)


async def test_close_aborts_the_running_turn_and_nothing_is_written_after_closed(
    tmp_path: Path,
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    gate = tmp_path / "gate"
    provider = script(tmp_path, [{"text": "never finished", "chunks": 3, "wait_for": str(gate)}])
    async with SessionManager(spec, HostOptions(provider=provider, close_grace=2.0)) as m:
        rec = await m.create(workdir(tmp_path))
        await m.send(rec.id, "go")
        closed = await m.close(rec.id)
        gate.touch()  # the provider's answer arrives after the close
        assert closed.state == "closed"
    log = records(spec, rec.id)
    assert log[-1]["type"] == "session_lifecycle" and log[-1]["state"] == "closed"
    finished = [r for r in log if r["type"] == "run_finished"]
    assert [r["outcome"] for r in finished] == ["aborted"]
    assert not any(r["type"] == "provider_request_finished" for r in log)


async def test_a_failed_start_keeps_the_record_with_its_error(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "hello"}])
    path = Path(provider.split(":", 1)[1])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.create(workdir(tmp_path))
        await m.close(rec.id)
        saved = path.read_text()
        path.unlink()
        failed = await m.resume(rec.id)
        assert failed.state == "error" and failed.last_error and "nope" not in failed.last_error
    async with SessionManager(spec, HostOptions(provider=provider)) as m2:
        again = await m2.get(rec.id)
        assert again.state == "error" and again.last_error == failed.last_error
        path.write_text(saved)
        back = await m2.resume(rec.id)
        assert (back.state, back.generation, back.last_error) == ("idle", 3, None)
        await m2.close(rec.id)


async def test_a_session_live_in_one_manager_is_refused_by_another(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "hello"}])
    async with (
        SessionManager(spec, HostOptions(provider=provider)) as a,
        SessionManager(spec, HostOptions(provider=provider, auto_resume="never")) as b,
    ):
        rec = await a.create(workdir(tmp_path))
        assert (await b.get(rec.id)).state == "idle"  # the owner is alive: as stored
        for verb in (b.resume, b.forget, b.close):
            with pytest.raises(SessionLive):
                await verb(rec.id)
        await a.close(rec.id)
        assert (await b.resume(rec.id)).generation == 2
        await b.close(rec.id)


# -- start-up reconciliation of a real crash ---------------------------------------------------


def crashed_cli_run(tmp_path: Path, spec: str, provider: str, point: str) -> str:
    """Run ``durable-harness run`` in a child that SIGKILLs itself at ``point`` (forked from the
    warm fork server, ``forkserver.run_cli``: a process of its own); return the session id."""
    env = {**os.environ, "DURABLE_HARNESS_CRASH_AT": point}
    argv = ["run", "go", "--store", spec, "--provider", provider, "--cwd", workdir(tmp_path)]
    proc = forkserver.run_cli([*argv, "--quiet"], env=env, cwd=os.getcwd(), timeout=60)
    assert proc.returncode == -9, proc.stderr
    (info,) = open_store(spec).list_sessions()
    return info.id


@pytest.mark.crash
async def test_a_crashed_run_is_suspended_decided_and_finished(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    provider = script(
        tmp_path,
        [
            {
                "text": "",
                "tool_calls": [{"name": "bash", "arguments": {"command": f"echo x >> {out}"}}],
            },
            {"text": "done"},
        ],
    )
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    assert out.read_text() == "x\n"
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.get(sid)
        assert rec.state == "suspended"
        plan = m.plan(sid)
        assert plan is not None
        (call,) = plan.open_calls()
        assert (call.tool_name, call.status, call.action) == ("bash", "in_doubt", "await_decision")
        status = await m.status(sid)
        assert status["plan"]["lanes"][0]["tool_calls"][0]["status"] == "in_doubt"
        assert m.awaiting_decisions() == {sid: 1}
        with pytest.raises(SessionNotLive):
            await m.send(sid, "more")
        resumed = await m.decide(sid, call.tool_call_id, "result:it ran once")
        assert resumed.state in ("idle", "running")
        await state_is(m, sid, "idle")
        await m.close(sid)
    assert out.read_text() == "x\n"  # the replay-never tool did not run again
    (finished,) = records(spec, sid, "run_finished")
    assert finished["outcome"] == "completed"


@pytest.mark.crash
async def test_a_plan_without_decisions_is_resumed_at_start_up(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "answer"}])
    sid = crashed_cli_run(tmp_path, spec, provider, "after_provider_request_started")
    async with SessionManager(spec, HostOptions(provider=provider, auto_resume="never")) as m:
        assert (await m.get(sid)).state == "suspended"
        plan = m.plan(sid)
        assert plan is not None and plan.lane("main").next_action == "reissue_provider_request"
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        await state_is(m, sid, "idle")
        assert (await m.get(sid)).generation >= 2
        await m.close(sid)
    (finished,) = records(spec, sid, "run_finished")
    assert finished["outcome"] == "completed"


@pytest.mark.parametrize("mode", ["sync", "batch", "none"])
async def test_a_run_that_ends_while_being_accepted_leaves_the_session_idle(
    tmp_path: Path, mode: str
) -> None:
    """In ``batch`` mode the prompt's barrier yields to a thread, so a scripted run may start
    and end before ``send`` returns: the session must still read ``idle`` afterwards."""
    spec = f"jsonl:{tmp_path / 'store'}"
    provider = script(tmp_path, [{"text": "quick"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.create(workdir(tmp_path), mode=mode)
        for n in range(5):
            await m.send(rec.id, f"prompt {n}")
            await state_is(m, rec.id, "idle")
        await m.close(rec.id)
    assert len(records(spec, rec.id, "run_finished")) == 5


async def test_the_command_runtime_is_recorded_and_chosen_again_on_resume(tmp_path: Path) -> None:
    """A PTY session's bash sees a terminal, in generation 1 and again after a resume."""
    spec = f"jsonl:{tmp_path / 'store'}"
    work = Path(workdir(tmp_path))
    probe = f"test -t 1 && echo tty >> {work / 'seen'} || echo pipe >> {work / 'seen'}"
    call = {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": probe}}]}
    provider = script(tmp_path, [call, {"text": "ok"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        rec = await m.create(str(work), command_runtime="pty")
        await m.send(rec.id, "probe")
        await state_is(m, rec.id, "idle")
        await m.close(rec.id)
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        back = await m.resume(rec.id)
        assert back.command_runtime == "pty"
        await m.send(rec.id, "probe again")
        await state_is(m, rec.id, "idle")
        await m.close(rec.id)
    assert (work / "seen").read_text() == "tty\ntty\n"


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
async def test_forget_deletes_a_closed_session_and_only_that_one(
    tmp_path: Path, backend: str
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}" if backend == "jsonl" else f"sqlite:{tmp_path / 'h.db'}"
    provider = script(tmp_path, [{"text": "hello"}])
    async with SessionManager(spec, HostOptions(provider=provider)) as m:
        gone = await m.create(workdir(tmp_path))
        kept = await m.create(workdir(tmp_path))
        await m.send(gone.id, "hi")
        await state_is(m, gone.id, "idle")
        with pytest.raises(SessionLive):
            await m.forget(gone.id)
        await m.close(gone.id)
        await m.forget(gone.id)
        with pytest.raises(SessionNotFound):
            await m.get(gone.id)
        assert [r.id for r in await m.list()] == [kept.id]
        assert (await m.get(kept.id)).state == "idle"
        await m.close(kept.id)
    assert [i.id for i in open_store(spec).list_sessions()] == [kept.id]
