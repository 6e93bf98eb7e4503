"""The ACP door of the provider rule (``durable_harness.providers.choice``): a session whose
transcript is OpenAI ``gpt-5.1``'s, loaded and prompted through the real ACP SDK client by an
agent started with ``--provider anthropic:...``, asks Anthropic for Anthropic's model."""

from __future__ import annotations

from pathlib import Path

import pytest
from acp import text_block
from acp_helpers import RecordingClient, agent, workdir
from providers.servers import FakeLLMServer, Turn

from durable_harness.session.session import Session
from durable_harness.storage import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.slow
async def test_a_loaded_session_of_another_provider_is_sent_the_agents_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = workdir(tmp_path)
    with Session(open_store(f"jsonl:{tmp_path / 'store'}").create_session(str(work))) as s:
        sid = s.id
        s.append_message({"role": "user", "content": "hello", "timestamp": 1})
        s.append_message(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "hi"}],
                "provider": "openai",
                "model": "gpt-5.1",
                "stopReason": "stop",
                "timestamp": 2,
            }
        )
    with FakeLLMServer() as srv:
        srv.queue(Turn(text="from claude"))
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.anthropic_base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
        client = RecordingClient(lambda _call, _options: "allow_once")
        async with agent(tmp_path, "anthropic:claude-x", client) as (conn, _proc):
            await conn.load_session(cwd=str(work), session_id=sid)
            done = await conn.prompt(session_id=sid, prompt=[text_block("go on")])
            assert done.stop_reason == "end_turn"
        assert [(r.path, r.body["model"]) for r in srv.requests] == [("/v1/messages", "claude-x")]
