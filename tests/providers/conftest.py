"""Shared fixtures for the provider tests: every ``anyio`` test runs under asyncio and trio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .servers import FakeLLMServer


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The async backend an ``@pytest.mark.anyio`` test runs on (both, one after the other)."""
    return str(request.param)


@pytest.fixture
def llm_server() -> Iterator[FakeLLMServer]:
    """A running :class:`FakeLLMServer`, stopped after the test."""
    with FakeLLMServer() as srv:
        yield srv
