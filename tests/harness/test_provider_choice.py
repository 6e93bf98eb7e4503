"""One rule for the provider and model of a run (``durable_harness.providers.choice``): the
provider given wins, and a session's model is only sent to a provider of its own family
(issue 20: ``gpt-5.1`` was sent to Anthropic)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from providers.servers import FakeLLMServer, Turn

from durable_harness.harness.harness import Harness, HarnessOptions
from durable_harness.providers.anthropic_provider import AnthropicProvider
from durable_harness.providers.choice import choose_provider, request_model
from durable_harness.providers.openai_compat import OpenAIProvider
from durable_harness.storage import Store

from .util import new_session, of_type

GPT = {"provider": "openai", "modelId": "gpt-5.1"}


def test_the_spec_given_wins_then_the_recorded_one_then_the_default() -> None:
    assert choose_provider(None, None, GPT) is None
    given = choose_provider("anthropic:claude-x", "openai:gpt-5.1", GPT, "openai:gpt-4o")
    assert given is not None
    assert (given.spec, given.source, given.model) == ("anthropic:claude-x", "given", "claude-x")
    assert given.ignored_model == GPT  # the session's model was not carried over
    recorded = choose_provider(None, "openai:gpt-4o", GPT, "anthropic:claude-x")
    assert recorded is not None
    assert (recorded.spec, recorded.source, recorded.model) == (
        "openai:gpt-4o",
        "recorded",
        "gpt-5.1",
    )
    assert recorded.ignored_model is None
    default = choose_provider(None, None, None, "anthropic:claude-x")
    assert default is not None and (default.source, default.model) == ("default", "claude-x")


def test_a_model_is_only_sent_to_a_provider_of_its_family() -> None:
    assert request_model("anthropic", "claude-x", GPT) == "claude-x"
    assert request_model("openai", "gpt-4o", GPT) == "gpt-5.1"
    assert request_model("openai", "gpt-4o", None) == "gpt-4o"
    assert request_model("openai", "gpt-4o", {"provider": "openai"}) == "gpt-4o"
    # an OpenAI-compatible provider under its own name is its own family
    assert request_model("ollama", "qwen3", GPT) == "qwen3"


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_session_of_one_provider_continued_with_another(
    store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    """Runs with OpenAI ``gpt-5.1``, then with Anthropic: the Anthropic request names the
    Anthropic provider's model, and the intent records it; back on OpenAI, the session's
    model (now Anthropic's) is not sent either."""
    llm_server.queue(Turn(text="one"), Turn(text="two"), Turn(text="three"))
    session = new_session(store, workdir)
    opts = HarnessOptions(retry_initial=0.01, retry_max=0.05)
    url, key = llm_server, "k"
    gpt = OpenAIProvider("gpt-5.1", base_url=url.openai_base_url, api_key=key, timeout=10.0)
    claude = AnthropicProvider(
        "claude-x", base_url=url.anthropic_base_url, api_key=key, timeout=10.0
    )
    gpt4 = OpenAIProvider("gpt-4o", base_url=url.openai_base_url, api_key=key, timeout=10.0)
    for provider in (gpt, claude, gpt4):
        async with Harness(session, provider, [], cwd=workdir, options=opts) as h:
            assert await (await h.prompt("hi")).wait() == "completed"
    sent = [(r.path, r.body["model"]) for r in llm_server.requests]
    assert sent == [
        ("/v1/chat/completions", "gpt-5.1"),
        ("/v1/messages", "claude-x"),
        ("/v1/chat/completions", "gpt-4o"),
    ]
    intents = of_type(session.store.records("main"), "provider_request_started")
    assert [(r["provider"], r["model"]) for r in intents] == [
        ("openai", "gpt-5.1"),
        ("anthropic", "claude-x"),
        ("openai", "gpt-4o"),
    ]
    session.close()


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_model_change_is_kept_within_its_family(
    store: Store, workdir: Path, llm_server: FakeLLMServer
) -> None:
    """``set_model`` to another model of the same provider is what the next request names;
    ``set_model`` to another provider's model is never sent to this one."""
    llm_server.queue(Turn(text="one"), Turn(text="two"))
    session = new_session(store, workdir)
    gpt = OpenAIProvider("gpt-4o", base_url=llm_server.openai_base_url, api_key="k", timeout=10.0)
    async with Harness(session, gpt, [], cwd=workdir) as h:
        await h.set_model("openai", "gpt-5.1")
        assert await (await h.prompt("hi")).wait() == "completed"
        await h.set_model("anthropic", "claude-x")
        assert await (await h.prompt("again")).wait() == "completed"
    assert [r.body["model"] for r in llm_server.requests] == ["gpt-5.1", "gpt-4o"]
    session.close()
