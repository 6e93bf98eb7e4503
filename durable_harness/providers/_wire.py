"""Helpers shared by the network providers: scrubbing a key out of error text, mapping the
HTTP library's transport errors, closing an SDK stream."""

from __future__ import annotations

import importlib
from typing import Any

from durable_harness.errors import ProviderError, redact


def scrub(text: str, secret: str | None) -> str:
    """Remove the literal ``secret`` and anything shaped like a key from ``text``."""
    if secret:
        text = text.replace(secret, "[redacted]")
    return redact(text)


def _load_transport_errors() -> tuple[type[BaseException], ...]:
    """``TransportError`` of ``httpx`` and ``httpx2``: the SDK does not wrap failures that
    happen while the response body streams (connection dropped, read timeout)."""
    found: list[type[BaseException]] = []
    for module_name in ("httpx2", "httpx"):
        try:
            module: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(module.TransportError)
    return tuple(found)


TRANSPORT_ERRORS = _load_transport_errors()


def transport_error(exc: BaseException, provider: str, secret: str | None) -> ProviderError:
    """Map a mid-stream ``httpx``/``httpx2`` transport failure: always ``retryable=True``."""
    kind = "timed out" if "Timeout" in type(exc).__name__ else "connection lost"
    message = f"{provider}: {kind} while streaming ({type(exc).__name__})"
    return ProviderError(scrub(message, secret), retryable=True, status=None, provider=provider)


async def close_stream(stream: Any, items: Any) -> None:
    """Close the SDK's event iterator (an async generator) and then its HTTP response."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()
    await stream.close()
