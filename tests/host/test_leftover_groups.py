"""A host SIGKILLed while a session's ``bash`` group runs: no host path lets that group land its
effect behind the record (``design/host.md``, "What happens to a running tool's group").

The child (:mod:`.group_child`) runs ``echo x >> effect; <hold until gate>; echo y >> effect``
and dies by SIGKILL with the group alive: killed by the test (the session is then
``suspended``), or by its own crash point after the abort is durable (a run settled
``aborted`` on resume), or the same in the middle of a close (stored ``closing``, read as
``closed``). Every check is that the recorded group is gone before the host reports the
session settled, closed or deletable; opening the gate afterwards must not produce ``y``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import (
    IllegalTransition,
    InvalidRequest,
    ToolProcessElsewhere,
    ToolProcessRunning,
)
from durable_harness.host import HostOptions, SessionManager
from durable_harness.http.errors import status_of
from durable_harness.storage import open_store
from durable_harness.storage.postgres.catalogue import PostgresStore
from durable_harness.tools.processes import group_alive

from .group_child import write_script

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

CHILD = Path(__file__).with_name("group_child.py")
DEADLINE = 30.0


@pytest.fixture
def anyio_backend() -> str:
    """The restarted host runs on asyncio (the harness tests cover trio)."""
    return "asyncio"


def _until(what: str, probe: Callable[[], Any]) -> Any:
    """Poll ``probe`` until it returns something truthy (deadline: ``DEADLINE``)."""
    end = time.monotonic() + DEADLINE
    while not (value := probe()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE:.0f} s waiting for {what}")
        time.sleep(0.02)
    return value


class Crashed:
    """What a crashed child left: the store spec, session id, work dir and recorded group."""

    def __init__(self, spec: str, sid: str, work: Path, group: tuple[int, int | None]):
        self.spec, self.sid, self.work, self.group = spec, sid, work, group

    def options(self, **kw: Any) -> HostOptions:
        """Host options of the restarted host (the child's provider script)."""
        return HostOptions(provider=f"scripted:{self.work.parent / 'script.json'}", **kw)

    def records(self, *types: str) -> list[dict[str, Any]]:
        """The session's records of ``types``, read without the lease."""
        with open_store(self.spec).open_session(self.sid, write=False) as store:
            return store.records(None, types=types or None)

    def assert_no_second_effect(self) -> None:
        """The group is gone; opening the gate lets nothing write ``y``."""
        assert not group_alive(*self.group), "the host let the tool's process group run on"
        (self.work / "gate").touch()
        assert (self.work / "effect").read_text() == "x\n"


@pytest.fixture
def crash(tmp_path: Path) -> Iterator[Callable[..., Crashed]]:
    """``crash(verb, spec=None, **env)``: run the child with ``verb`` (on store ``spec``,
    default SQLite) until it dies by SIGKILL, group alive."""
    works: list[Path] = []

    def run(verb: str, spec: str | None = None, **extra_env: str) -> Crashed:
        work = tmp_path / "work"
        work.mkdir()
        works.append(work)
        spec = spec or f"sqlite:{tmp_path}/host.db"
        write_script(tmp_path / "script.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS_CRASH")}
        env.update(extra_env)
        if not verb.startswith("hold"):
            env["DURABLE_HARNESS_CRASH_AT"] = "after_abort_requested"
        child = subprocess.Popen(
            [sys.executable, str(CHILD), verb, spec, str(work), str(tmp_path / "script.json")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: killing it never touches the bash group
        )
        try:
            if verb.startswith("hold"):
                _until("x", lambda: (work / "effect").exists() and (work / "effect").read_text())
                os.killpg(child.pid, signal.SIGKILL)
            assert child.wait(DEADLINE) == -signal.SIGKILL, child.stderr and child.stderr.read()
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        sid = (work / "id").read_text()
        with open_store(spec).open_session(sid, write=False) as store:
            (rec,) = store.records(None, types=("tool_process",))
        group = (int(rec["pgid"]), rec.get("startTime"))
        assert group_alive(*group), "the bash group should outlive its host"
        return Crashed(spec, sid, work, group)

    yield run
    for work in works:
        (work / "gate").touch()  # whatever failed, no bash is left waiting


async def _until_state(manager: SessionManager, sid: str, state: str) -> None:
    with anyio.fail_after(DEADLINE):
        while (await manager.get(sid)).state != state:
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_restart_settles_the_aborted_run_only_after_killing_its_group(
    crash: Callable[[str], Crashed],
) -> None:
    c = crash("abort")
    async with SessionManager(c.spec, c.options(auto_resume="no_decision")) as manager:
        await _until_state(manager, c.sid, "idle")  # resumed: settled aborted
        assert [r["outcome"] for r in c.records("run_finished")] == ["aborted"]
        c.assert_no_second_effect()


@pytest.mark.anyio
async def test_start_up_kills_and_records_the_group_before_the_plan(
    crash: Callable[[str], Crashed],
) -> None:
    c = crash("hold")
    async with SessionManager(c.spec, c.options()) as manager:
        # reconciliation is over: the group is dead before anything can read a plan
        assert not group_alive(*c.group)
        (killed,) = c.records("tool_process_killed")
        assert (killed["pgid"], killed["by"]) == (c.group[0], "reconcile")
        rec = await manager.get(c.sid)
        assert rec.state == "suspended"  # the call still waits for a decision
        plan = manager.plan(c.sid)
        assert plan is not None
        (call,) = plan.lanes[0].tool_calls
        assert (call.status, call.action, call.process) == ("in_doubt", "await_decision", None)
        c.assert_no_second_effect()
        with pytest.raises(IllegalTransition):
            await manager.forget(c.sid)
        assert (await manager.close(c.sid)).state == "closed"
        assert len(c.records("tool_process_killed")) == 1  # nothing left to kill or record
        await manager.forget(c.sid)


@pytest.mark.anyio
async def test_a_group_of_another_machine_is_reported_and_its_retry_refused_unless_forced(
    crash: Callable[[str], Crashed],
) -> None:
    c = crash("hold-elsewhere")
    async with SessionManager(c.spec, c.options()) as manager:
        assert group_alive(*c.group)  # another machine's pgid is never signalled here
        assert c.records("tool_process_killed") == []
        plan = manager.plan(c.sid)
        assert plan is not None
        (call,) = plan.lanes[0].tool_calls
        assert call.process is not None
        assert (call.process["host"], call.process["pgid"]) == ("other-machine", c.group[0])
        assert call.process["alive"] is None  # unknown from here
        with pytest.raises(ToolProcessElsewhere) as refused:
            await manager.decide(c.sid, call.tool_call_id, "retry")
        assert refused.value.details["host"] == "other-machine"
        assert refused.value.details["pid"] == c.group[0]
        assert status_of(refused.value) == 409
        assert [r["decision"] for r in c.records("decision")] == []  # nothing recorded
        with pytest.raises(InvalidRequest) as elsewhere:  # the operator kills it there
            await manager.kill_tool(c.sid, call.tool_call_id)
        assert elsewhere.value.details["host"] == "other-machine"
        (c.work / "gate").touch()  # let both runs of the command finish
        rec = await manager.decide(c.sid, call.tool_call_id, "retry!")
        assert rec.state in ("running", "idle")
        await _until_state(manager, c.sid, "idle")
        (decision,) = c.records("decision")
        assert (decision["decision"], decision["force"]) == ("retry", True)


@pytest.mark.anyio
async def test_a_close_interrupted_by_a_crash_is_finished_at_start_up(
    crash: Callable[[str], Crashed],
) -> None:
    c = crash("close")
    stored = [r["state"] for r in c.records("session_lifecycle")]
    assert stored[-1] == "closing"
    async with SessionManager(c.spec, c.options(auto_resume="never")) as manager:
        assert (await manager.get(c.sid)).state == "closed"
        c.assert_no_second_effect()
        assert [r["state"] for r in c.records("session_lifecycle")][-1] == "closed"
        await manager.forget(c.sid)


@pytest.mark.anyio
async def test_forget_refuses_a_closed_session_whose_group_still_runs(
    tmp_path: Path, crash: Callable[[str], Crashed]
) -> None:
    # the host starts before the other one crashes mid-close: its start-up saw nothing
    spec = f"sqlite:{tmp_path}/host.db"
    write_script(tmp_path / "script.json")
    options = HostOptions(provider=f"scripted:{tmp_path / 'script.json'}", auto_resume="never")
    async with SessionManager(spec, options) as manager:
        c = crash("close")
        assert (await manager.get(c.sid)).state == "closed"
        with pytest.raises(ToolProcessRunning) as refused:
            await manager.forget(c.sid)
        assert refused.value.details["pgids"] == [c.group[0]]
        assert status_of(refused.value) == 409
        assert group_alive(*c.group)  # refusing kills nothing
        assert (await manager.close(c.sid)).state == "closed"  # closing again kills it
        c.assert_no_second_effect()
        await manager.forget(c.sid)


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_worker_claiming_a_dead_workers_session_kills_its_group_first(
    crash: Callable[..., Crashed], pg_spec: str, tmp_path: Path
) -> None:
    options = HostOptions(provider=f"scripted:{tmp_path / 'script.json'}", claim_interval=0.2)
    async with SessionManager(PostgresStore(pg_spec, lease_s=1), options) as manager:
        c = crash("hold", pg_spec, DURABLE_HARNESS_PG_LEASE_S="1")
        assert manager.worker is not None
        with anyio.fail_after(DEADLINE):  # the worker runs on this loop: poll without blocking
            while not c.records("tool_process_killed"):
                await anyio.sleep(0.05)
        (killed,) = c.records("tool_process_killed")
        assert (killed["pgid"], killed["by"]) == (c.group[0], "claim")
        assert manager.worker.claimed == [c.sid]
        c.assert_no_second_effect()
