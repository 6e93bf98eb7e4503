"""ACP (issue 20): a permission answer for an in-doubt call that another door decided while
the question was out is refused as a JSON-RPC error (``-32010``, ``data.code``
``already_decided``), and nothing runs again or is written. The in-doubt calls come from a real
SIGKILL of the agent process after two replay-never calls' effects, neither settled; the other
door is the CLI's ``resume --decide`` in a child process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError
from acp_helpers import RecordingClient, agent, script, workdir
from test_acp_crash import crashed_prompt

from durable_harness.acp.errors import CONFLICT
from durable_harness.crashtest import forkserver
from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.crash, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _command(log: Path, mine: str, other: str) -> str:
    return f"echo {mine} >> {log}; until grep -q {other} {log}; do sleep 0.01; done"


async def test_an_answer_for_a_call_decided_meanwhile_is_an_rpc_error(tmp_path: Path) -> None:
    work = workdir(tmp_path)
    log = work / "effects.log"
    calls = [
        {"id": f"call_{n}", "name": "bash", "arguments": {"command": _command(log, n, o)}}
        for n, o in (("a", "b"), ("b", "a"))
    ]
    provider = script(tmp_path, [{"text": "", "tool_calls": calls}, {"text": "Finished."}])
    sid = await crashed_prompt(tmp_path, provider, RecordingClient(), crash_at="after_tool_effect")
    assert sorted(log.read_text().split()) == ["a", "b"]
    spec = f"jsonl:{tmp_path / 'store'}"

    def answer(call: Any, _options: Any) -> str:
        if call.tool_call_id == "call_a":  # meanwhile, an operator decides it elsewhere
            other = forkserver.run_cli(
                ["resume", sid, "--store", spec, "--decide", "call_a=result:a was appended",
                 "--quiet"],
                env=dict(os.environ), cwd=os.getcwd(), timeout=60,
            )  # fmt: skip
            assert other.returncode == 5, other.stderr  # recorded; call_b still waits
            return "retry"
        return "skip"

    client = RecordingClient(answer)
    async with agent(tmp_path, provider, client) as (conn, _proc):
        with pytest.raises(RequestError) as caught:
            await conn.load_session(cwd=str(work), session_id=sid)
    err = caught.value
    assert err.code == CONFLICT
    data = err.data or {}
    assert data["code"] == "already_decided"
    assert data["tool_call_id"] == "call_a"
    assert data["on_record"]["decision"] == "result"
    with open_store(spec).open_session(sid, write=False) as store:
        decisions = store.records("main", types=("decision",))
        started = store.records("main", types=("tool_started",))
    assert [(d["toolCallId"], d["decision"]) for d in decisions] == [("call_a", "result")]
    assert len(started) == 2  # the refused retry ran nothing
    assert sorted(log.read_text().split()) == ["a", "b"]
