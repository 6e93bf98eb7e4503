"""Reading sessions the manager does not run: ``list`` and ``get`` keep each record and plan
by the session's last seq, lease generation and owner, so an unchanged session is not read and
planned again, and a change made elsewhere (another process, another manager) is always seen
(``design/host.md``, "Reading a session")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crashtest import forkserver
from durable_harness.host import HostOptions, SessionManager
from durable_harness.host import listing as listing_module
from durable_harness.host import reconcile as reconcile_module

from .test_manager import crashed_cli_run, script, state_is, workdir

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.crash]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _in_doubt(tmp_path: Path, spec: str) -> tuple[str, str, Path]:
    """A CLI run SIGKILLed after its bash call's effect: (session id, provider, effects)."""
    out = Path(workdir(tmp_path)) / "effects.txt"
    call = {"name": "bash", "arguments": {"command": f"echo x >> {out}"}}
    provider = script(tmp_path, [{"text": "", "tool_calls": [call]}, {"text": "done"}])
    return crashed_cli_run(tmp_path, spec, provider, "after_tool_effect"), provider, out


def _count_plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = reconcile_module.plan_recovery

    async def counting(store: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(store.session_id)
        return await real(store, *args, **kwargs)

    # a read plans in host/listing.py (shared with the CLI), a resume in host/reconcile.py
    monkeypatch.setattr(reconcile_module, "plan_recovery", counting)
    monkeypatch.setattr(listing_module, "plan_recovery", counting)
    return seen


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
async def test_list_does_not_plan_an_unchanged_session_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}" if backend == "jsonl" else f"sqlite:{tmp_path / 'h.db'}"
    sid, provider, _ = _in_doubt(tmp_path, spec)
    plans = _count_plans(monkeypatch)
    options = HostOptions(provider=provider, auto_resume="never")
    async with SessionManager(spec, options) as m:
        assert plans == [sid]  # start-up reconciliation planned it once
        for _ in range(3):
            (rec,) = await m.list()
            assert rec.state == "suspended"
            rec.state = "closed"  # a caller's copy: the kept record is not changed
            assert (await m.get(sid)).state == "suspended"
        plan = m.plan(sid)
        assert plan is not None and len(plan.open_calls()) == 1
        assert m.awaiting_decisions() == {sid: 1}
        assert plans == [sid]  # not planned again: nothing changed


async def test_a_change_by_another_process_is_seen(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    sid, provider, out = _in_doubt(tmp_path, spec)
    options = HostOptions(provider=provider, auto_resume="never")
    async with SessionManager(spec, options) as m:
        (rec,) = await m.list()
        assert rec.state == "suspended"
        plan = m.plan(sid)
        assert plan is not None
        (call,) = plan.open_calls()
        argv = ["resume", sid, "--store", spec]
        decided = forkserver.run_cli(  # another process, forked from the warm fork server
            [*argv, "--quiet", "--decide", f"{call.tool_call_id}=result:it ran once"],
            env=dict(os.environ),
            cwd=os.getcwd(),
            timeout=60,
        )
        assert decided.returncode == 0, decided.stderr
        (rec,) = await m.list()
        assert rec.state == "closed"  # the CLI finished the run and closed the session
        assert m.plan(sid) is None and m.awaiting_decisions() == {}
    assert out.read_text() == "x\n"


async def test_a_lease_taken_and_dropped_elsewhere_is_seen(tmp_path: Path) -> None:
    """Another manager resumes the session (the lease is live), then stops without closing
    (its lease is dropped, nothing written): the first manager reads both changes."""
    spec = f"sqlite:{tmp_path / 'h.db'}"
    sid, provider, out = _in_doubt(tmp_path, spec)
    options = HostOptions(provider=provider, auto_resume="never")
    async with SessionManager(spec, options) as m:
        assert (await m.get(sid)).state == "suspended"
        plan = m.plan(sid)
        assert plan is not None
        (call,) = plan.open_calls()
        async with SessionManager(spec, options) as other:
            await other.decide(sid, call.tool_call_id, "result:it ran once")
            await state_is(other, sid, "idle")
            (rec,) = await m.list()
            assert rec.state == "idle"  # live in the other manager
            assert m.plan(sid) is None
        # the other manager stopped without closing: its lease is gone, its state stale
        (rec,) = await m.list()
        assert rec.state == "suspended"
        plan = m.plan(sid)
        assert plan is not None and plan.open_calls() == []
        await m.resume(sid)
        await state_is(m, sid, "idle")
        await m.close(sid)
    assert out.read_text() == "x\n"


async def test_a_plan_that_asked_a_reconcile_hook_is_planned_again(tmp_path: Path) -> None:
    """The hook looks at the world, which changes without the log: a write_file in doubt
    whose file appears (written by hand) is planned ``reconcile`` at the next read."""
    spec = f"jsonl:{tmp_path / 'store'}"
    target = Path(workdir(tmp_path)) / "out.txt"
    call = {"name": "write_file", "arguments": {"path": "out.txt", "content": "hello"}}
    provider = script(tmp_path, [{"text": "", "tool_calls": [call]}, {"text": "done"}])
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_started")
    assert not target.exists()
    async with SessionManager(spec, HostOptions(provider=provider, auto_resume="never")) as m:
        (rec,) = await m.list()
        plan = m.plan(sid)
        assert rec.state == "suspended" and plan is not None
        assert [c.action for c in plan.open_calls()] == ["await_decision"]
        target.write_text("hello")  # the operator finds it was written after all
        await m.list()
        plan = m.plan(sid)
        assert plan is not None
        assert [c.action for c in plan.open_calls()] == ["reconcile"]
