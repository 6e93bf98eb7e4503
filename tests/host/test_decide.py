"""``SessionManager.decide`` refuses a tool call id that names no call in doubt by the one rule
(``recovery.decide.resolve_decisions``), before the writer lease is taken: nothing on disk
changes, and the error lists the calls that can be decided."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from durable_harness.errors import AlreadyDecided, RecoveryError, SessionLive
from durable_harness.host import HostOptions, SessionManager

from .test_manager import crashed_cli_run, records, script, state_is, until, workdir

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.crash]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


async def test_an_unknown_call_id_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "store"
    spec = f"jsonl:{root}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    call = {"name": "bash", "arguments": {"command": f"echo x >> {out}"}}
    provider = script(tmp_path, [{"text": "", "tool_calls": [call]}, {"text": "done"}])
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    async with SessionManager(spec, HostOptions(provider=provider, auto_resume="never")) as m:
        plan = m.plan(sid)
        assert plan is not None
        (doubt,) = plan.open_calls()
        before = _files(root)
        with pytest.raises(RecoveryError) as caught:
            await m.decide(sid, "call_typo", "fail")
        assert "'call_typo'" in caught.value.message
        assert doubt.tool_call_id in caught.value.message  # the ones that can be decided
        assert caught.value.details["in_doubt"] == [doubt.tool_call_id]
        assert _files(root) == before  # not even the lease was taken
        assert (await m.get(sid)).state == "suspended"
        resumed = await m.decide(sid, doubt.tool_call_id, "result:ran once")
        assert resumed.state in ("idle", "running")
        await state_is(m, sid, "idle")
        await m.close(sid)
    assert out.read_text() == "x\n"


async def test_a_second_decision_is_already_decided_while_the_resumed_run_is_open(
    tmp_path: Path,
) -> None:
    """The decision resumed the session; its run is still open (the next provider turn waits
    on a gate): a second decision for the call reads ``already_decided`` (naming the decision
    on record), not just ``session_live``, and nothing is written."""
    root = tmp_path / "store"
    spec = f"jsonl:{root}"
    out = Path(workdir(tmp_path)) / "effects.txt"
    gate = tmp_path / "gate"
    call = {"name": "bash", "arguments": {"command": f"echo x >> {out}"}}
    turns = [{"text": "", "tool_calls": [call]}, {"text": "done", "wait_for": str(gate)}]
    provider = script(tmp_path, turns)
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    async with SessionManager(spec, HostOptions(provider=provider, auto_resume="never")) as m:
        plan = m.plan(sid)
        assert plan is not None
        (doubt,) = plan.open_calls()
        resumed = await m.decide(sid, doubt.tool_call_id, "result:ran once")
        assert resumed.state in ("idle", "running")
        await state_is(m, sid, "running")

        async def asked_turn_2() -> bool:  # its intent durable: the provider waits on the gate
            return len(records(spec, sid, "provider_request_started")) == 2

        await until(asked_turn_2, "the resumed run to wait on turn 2")
        before = _files(root)
        with pytest.raises(AlreadyDecided) as caught:
            await m.decide(sid, doubt.tool_call_id, "retry")
        assert caught.value.details["on_record"]["decision"] == "result"
        assert caught.value.details["call_key"] == doubt.call_key
        assert _files(root) == before
        gate.touch()
        await state_is(m, sid, "idle")
        with pytest.raises(SessionLive):  # the run is over: nothing of it is open to decide
            await m.decide(sid, doubt.tool_call_id, "retry")
        await m.close(sid)
    assert out.read_text() == "x\n"
