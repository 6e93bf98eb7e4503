"""``durable-harness acp --root DIR``: ``session/new`` in a directory outside the roots is a
JSON-RPC error (``-32602``, ``data.code`` ``cwd_not_allowed``) and creates nothing; inside
one it works (the host's one rule, ``design/host.md`` "Roots")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from acp import RequestError
from acp_helpers import RecordingClient, agent, script

from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.slow
async def test_session_new_is_confined_to_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "allowed"
    (root / "project").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, root / "link")  # inside by name, outside for real
    client = RecordingClient()
    provider = script(tmp_path, [{"text": "hi"}])
    async with agent(tmp_path, provider, client, extra=("--root", str(root))) as (conn, _proc):
        for cwd in (outside, root / "link", tmp_path):
            with pytest.raises(RequestError) as refused:
                await conn.new_session(cwd=str(cwd))
            assert refused.value.code == -32602
            assert refused.value.data["code"] == "cwd_not_allowed", refused.value.data
            assert str(root) in str(refused.value)
        assert open_store(f"jsonl:{tmp_path / 'store'}").list_sessions() == []
        new = await conn.new_session(cwd=str(root / "project"))
        assert new.session_id
    (log,) = sorted(tmp_path.glob("agent-*.log"))
    assert f"sessions may run only under {root}" in log.read_text()
