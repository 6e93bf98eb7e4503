"""The one retry rule (:mod:`durable_harness.providers.failures`): the table itself, and both
network providers applying it the same way to real HTTP answers and mid-stream error events."""

from __future__ import annotations

from typing import Any

import pytest

from durable_harness.errors import ProviderError
from durable_harness.providers.anthropic_provider import AnthropicProvider
from durable_harness.providers.base import Provider, ProviderRequest
from durable_harness.providers.failures import (
    ERROR_TYPE_STATUS,
    error_body,
    retryable_error_type,
    retryable_status,
)
from durable_harness.providers.openai_compat import OpenAIProvider

from .servers import FakeLLMServer, StatusError, Turn

# status -> retryable: the SDKs' own rule (408, 409, 429, 5xx), which the harness takes over.
STATUS_TABLE = {
    400: False,
    401: False,
    402: False,
    403: False,
    404: False,
    408: True,
    409: True,
    413: False,
    422: False,
    429: True,
    500: True,
    502: True,
    503: True,
    504: True,
    529: True,
}

# mid-stream error type -> retryable.
TYPE_TABLE: dict[str | None, bool] = {
    "invalid_request_error": False,
    "authentication_error": False,
    "billing_error": False,
    "permission_error": False,
    "not_found_error": False,
    "request_too_large": False,
    "rate_limit_error": True,
    "api_error": True,
    "timeout_error": True,
    "overloaded_error": True,
    "server_error": True,
    "an_error_type_nobody_documents": True,
    "": True,
    None: True,
}


@pytest.mark.parametrize(("status", "expected"), sorted(STATUS_TABLE.items()))
def test_status_table(status: int, expected: bool) -> None:
    assert retryable_status(status) is expected
    assert retryable_status(status, {}) is expected
    assert retryable_status(status, {"x-should-retry": "maybe"}) is expected


@pytest.mark.parametrize("status", sorted(STATUS_TABLE))
def test_x_should_retry_header_wins(status: int) -> None:
    assert retryable_status(status, {"x-should-retry": "true"}) is True
    assert retryable_status(status, {"x-should-retry": "false"}) is False


@pytest.mark.parametrize(("etype", "expected"), list(TYPE_TABLE.items()))
def test_error_type_table(etype: str | None, expected: bool) -> None:
    assert retryable_error_type(etype) is expected


def test_every_documented_type_follows_its_status() -> None:
    assert set(ERROR_TYPE_STATUS) <= set(TYPE_TABLE)
    for etype, status in ERROR_TYPE_STATUS.items():
        assert retryable_error_type(etype) is retryable_status(status), etype


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"error": {"type": "api_error", "message": "boom"}}, ("api_error", "boom")),
        ({"type": "overloaded_error", "message": "busy"}, ("overloaded_error", "busy")),
        ({"error": {"type": "x"}}, ("x", '{"error": {"type": "x"}}')),
        ({"error": "plain text"}, ("", "plain text")),
        ("raw body", ("", "raw body")),
        (None, ("", "")),
        ({"error": {"message": "m" * 900}}, ("", "m" * 500)),
    ],
)
def test_error_body(body: object, expected: tuple[str, str]) -> None:
    assert error_body(body) == expected


# -- both providers, over HTTP ---------------------------------------------------------------

PROVIDERS = ["openai", "anthropic"]
KEY = "sk-test-failures-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    """The rule does not depend on the event loop: asyncio only."""
    return "asyncio"


def make(kind: str, srv: FakeLLMServer) -> Provider:
    if kind == "openai":
        return OpenAIProvider("gpt-test", base_url=srv.openai_base_url, api_key=KEY, timeout=10)
    return AnthropicProvider(
        "claude-test", base_url=srv.anthropic_base_url, api_key=KEY, timeout=10
    )


async def fail(provider: Provider) -> ProviderError:
    request = ProviderRequest(messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(ProviderError) as info:
        async for _ in provider.stream(request):
            pass
    return info.value


@pytest.mark.anyio
@pytest.mark.parametrize("kind", PROVIDERS)
@pytest.mark.parametrize("status", [400, 404, 408, 409, 413, 422, 429, 500, 529])
async def test_providers_apply_the_status_table(
    llm_server: FakeLLMServer, kind: str, status: int
) -> None:
    llm_server.queue(StatusError(status, "nope"))
    err = await fail(make(kind, llm_server))
    assert (err.status, err.retryable) == (status, STATUS_TABLE[status])
    assert len(llm_server.requests) == 1  # the SDK itself never retries


@pytest.mark.anyio
@pytest.mark.parametrize("kind", PROVIDERS)
@pytest.mark.parametrize(("status", "header"), [(429, "false"), (400, "true")])
async def test_providers_obey_x_should_retry(
    llm_server: FakeLLMServer, kind: str, status: int, header: str
) -> None:
    llm_server.queue(StatusError(status, "nope", headers={"x-should-retry": header}))
    err = await fail(make(kind, llm_server))
    assert err.retryable is (header == "true")


@pytest.mark.anyio
@pytest.mark.parametrize("kind", PROVIDERS)
@pytest.mark.parametrize(
    "etype",
    ["invalid_request_error", "overloaded_error", "server_error", "an_error_type_nobody_documents"],
)
async def test_providers_apply_the_error_type_table(
    llm_server: FakeLLMServer, kind: str, etype: str
) -> None:
    error: dict[str, Any] = {"type": etype, "message": "stream broke"}
    llm_server.queue(Turn(text="abcdefgh", error_after=2, error=error))
    err = await fail(make(kind, llm_server))
    assert err.status is None
    assert err.retryable is TYPE_TABLE[etype]
    assert "stream broke" in err.message
