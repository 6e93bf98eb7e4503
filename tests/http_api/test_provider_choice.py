"""The host door of the provider rule (``durable_harness.providers.choice``): a session whose
transcript is OpenAI ``gpt-5.1``'s, resumed over HTTP by a host whose provider is Anthropic,
asks Anthropic for Anthropic's model (issue 20)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from providers.servers import FakeLLMServer, Turn

from durable_harness.session.session import Session
from durable_harness.storage import open_store

from .test_api import send
from .util import poll, run_records, wait_state


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_over_http_sends_the_host_providers_model(
    start_server, workdir: Path, tmp_path: Path, llm_server: FakeLLMServer
) -> None:
    spec = f"jsonl:{tmp_path / 'store'}"
    with Session(open_store(spec).create_session(str(workdir))) as s:
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
    llm_server.queue(Turn(text="from claude"))
    env = {"ANTHROPIC_BASE_URL": llm_server.anthropic_base_url, "ANTHROPIC_API_KEY": "k"}
    server = start_server(spec, "--provider", "anthropic:claude-x", env=env)
    with server.client() as c:
        resumed = c.post(f"/sessions/{sid}/resume", json={})
        assert resumed.status_code == 200, resumed.text
        assert send(c, sid, "go on").status_code == 202
        poll(
            lambda: len(c.get(f"/sessions/{sid}/agent/messages").json()["entries"]) == 4 or None,
            "the answer",
        )
        wait_state(c, sid, "idle")
        c.post(f"/sessions/{sid}/close", json={})
    assert [(r.path, r.body["model"]) for r in llm_server.requests] == [
        ("/v1/messages", "claude-x")
    ]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_price_prices_turns_and_without_it_cost_is_null(
    start_server, script, workdir: Path, tmp_path: Path
) -> None:
    """``serve --price`` is the price of the host's runs; without it a turn whose provider
    reports no cost settles with ``usage.cost`` null, never 0 (issue 20)."""
    from .test_api import create

    provider = script([{"text": "hi", "usage": {"input": 1000, "output": 100}}])
    seen = []
    for n, extra in enumerate(((), ("--price", "2,10"))):
        server = start_server(f"jsonl:{tmp_path / f'store{n}'}", *extra)
        with server.client() as c:
            sid = create(c, workdir, provider)["id"]
            assert send(c, sid, "go").status_code == 202
            done = poll(
                lambda c=c, sid=sid: run_records(c, sid, "provider_request_finished") or None,
                "the turn's settlement",
            )
            seen.append(done[0]["usage"]["cost"])
            c.post(f"/sessions/{sid}/close", json={})
    assert seen[0] is None
    assert seen[1]["total"] == pytest.approx(0.003)
