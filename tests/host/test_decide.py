"""``SessionManager.decide`` refuses a tool call id that names no call in doubt by the one rule
(``recovery.decide.resolve_decisions``), before the writer lease is taken: nothing on disk
changes, and the error lists the calls that can be decided."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from durable_harness.errors import RecoveryError
from durable_harness.host import HostOptions, SessionManager

from .test_manager import crashed_cli_run, script, state_is, workdir

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
