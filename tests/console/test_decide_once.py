"""The console's decide form twice for one call (issue 20): the second decision is refused
with a clear page (409 ``already_decided``, naming the call and the decision on record, not a
500), nothing is written, and the call does not run again. The in-doubt calls come from a real
SIGKILL of ``durable-harness run`` after two replay-never calls' effects, neither settled."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_harness.host import HostOptions

from .conftest import crashed_cli_run, script, workdir
from .test_routes import console, csrf_of, idle, records

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90), pytest.mark.crash]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _command(log: Path, mine: str, other: str) -> str:
    return f"echo {mine} >> {log}; until grep -q {other} {log}; do sleep 0.01; done"


async def test_a_second_console_decision_is_refused_with_a_clear_page(tmp_path: Path) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    log = Path(workdir(tmp_path)) / "effects.log"
    calls = [
        {"id": f"call_{n}", "name": "bash", "arguments": {"command": _command(log, n, o)}}
        for n, o in (("a", "b"), ("b", "a"))
    ]
    provider = script(tmp_path, [{"text": "", "tool_calls": calls}, {"text": "done"}])
    sid = crashed_cli_run(tmp_path, spec, provider, "after_tool_effect")
    async with console(spec, HostOptions(provider=provider)) as (m, c):
        token = csrf_of((await c.get(f"/console/sessions/{sid}")).text)
        plan = m.plan(sid)
        assert plan is not None
        by_id = {call.tool_call_id: call for call in plan.open_calls()}
        assert set(by_id) == {"call_a", "call_b"}

        def form(call_id: str, decision: str, result: str = "") -> dict[str, str]:
            call = by_id[call_id]
            return {
                "csrf_token": token,
                "call_key": call.call_key,
                "tool_call_id": call.tool_call_id,
                "decision": decision,
                "result": result,
                "confirmed": "yes",
            }

        first = await c.post(f"/console/sessions/{sid}/decide", data=form("call_a", "result", "a"))
        assert first.status_code == 303
        assert first.headers["location"] == f"/console/sessions/{sid}?notice=waiting"
        before = records(spec, sid)
        second = await c.post(f"/console/sessions/{sid}/decide", data=form("call_a", "retry"))
        assert second.status_code == 409, second.text[:500]
        assert "already_decided" in second.text and "already decided" in second.text
        assert "call_a" in second.text
        assert records(spec, sid) == before  # nothing written
        assert (await m.get(sid)).state == "suspended"

        last = await c.post(f"/console/sessions/{sid}/decide", data=form("call_b", "result", "b"))
        assert last.status_code == 303
        await idle(m, sid)
        await m.close(sid)
    assert sorted(log.read_text().split()) == ["a", "b"]  # each effect exactly once
    assert [r["toolCallId"] for r in records(spec, sid, "decision")] == ["call_a", "call_b"]
    assert len(records(spec, sid, "tool_started")) == 2
