"""Helpers shared by the network providers for driving an SDK and what goes on the wire: the
base URL and key settings, a stream that always closes its client, parsing streamed tool
arguments, checking an image against what a provider accepts, and tool-call ids a provider
accepts. What a failure means (retryable or not) is :mod:`durable_harness.providers.failures`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio

from durable_harness.errors import ProviderError


class _Closable(Protocol):
    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Closable)
EventT = TypeVar("EventT")


def setting(value: str | None, env: str) -> str | None:
    """``value`` when given (non-empty), else the environment variable ``env`` when set and
    non-empty, else ``None``: how a provider takes its base URL and API key."""
    return value or os.environ.get(env) or None


def client_options(
    *, provider: str, api_key: str | None, key_env: str, base_url: str | None, timeout: Any
) -> dict[str, Any]:
    """Keyword arguments for an SDK client (``openai.AsyncOpenAI``,
    ``anthropic.AsyncAnthropic``): ``api_key``, ``base_url``, ``timeout`` (the SDK's
    ``Timeout``: seconds per phase, the read one being the provider's idle timeout) and
    ``max_retries=0``: the SDK never retries, the harness does (one
    ``provider_request_started`` record per attempt; the rule is
    :mod:`durable_harness.providers.failures`).

    Raises:
        ProviderError: ``api_key`` is missing (``retryable=False``; the message names
            ``key_env``).
    """
    if not api_key:
        raise ProviderError(
            f"{provider}: no API key (pass api_key= or set {key_env})",
            retryable=False,
            provider=provider,
        )
    return {"api_key": api_key, "base_url": base_url, "timeout": timeout, "max_retries": 0}


async def stream_closing(
    open_client: Callable[[], ClientT], body: Callable[[ClientT], AsyncGenerator[EventT, None]]
) -> AsyncGenerator[EventT, None]:
    """Open an SDK client with ``open_client()`` when iteration starts, yield every event of
    ``body(client)``, and close ``body``'s generator and then the client (shielded from
    cancellation) however the iteration ends: exhausted, failed, cancelled or closed early.

    Raises:
        Whatever ``open_client`` or ``body`` raises (a provider's :class:`ProviderError`).
    """
    client = open_client()
    try:
        async with contextlib.aclosing(body(client)) as events:
            async for event in events:
                yield event
    finally:
        with anyio.CancelScope(shield=True):
            await client.close()


def parse_tool_arguments(
    raw: str, *, name: object, call_id: object, provider: str
) -> dict[str, Any]:
    """Parse a streamed tool call's accumulated JSON arguments ``raw`` (blank means ``{}``).

    Raises:
        ProviderError: ``raw`` is not a JSON object (``retryable=False``; ``details`` carry
            ``tool_call_id``): sending the request again would not change what was generated
            for the recorded context.
    """
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ProviderError(
            f"{provider}: tool call {name!r} has arguments that are not a JSON object",
            retryable=False,
            provider=provider,
            tool_call_id=call_id,
        )
    return value


async def close_stream(stream: Any, items: Any) -> None:
    """Close the SDK's event iterator (an async generator) and then its HTTP response."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()
    await stream.close()


@dataclass(frozen=True)
class ImageLimits:
    """What one provider accepts as a base64 image: ``media_types`` and ``max_bytes`` (the
    base64 text's length, in bytes: the stricter of the two readings of a size limit)."""

    provider: str
    media_types: tuple[str, ...]
    max_bytes: int


ANTHROPIC_IMAGES = ImageLimits(
    "anthropic", ("image/jpeg", "image/png", "image/gif", "image/webp"), 5 * 1024 * 1024
)
"""Anthropic Messages (vision guide): JPEG, PNG, GIF, WebP; 5 MB per image on the API."""

OPENAI_IMAGES = ImageLimits(
    "openai", ("image/jpeg", "image/png", "image/gif", "image/webp"), 20 * 1024 * 1024
)
"""OpenAI chat completions (images guide): PNG, JPEG, WEBP, non-animated GIF; 20 MB per image."""

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),  # after "RIFF" and the 4-byte size
)


def sniff_image(raw: bytes) -> str | None:
    """The media type the bytes ``raw`` start with (PNG, JPEG, GIF, WebP), or ``None``."""
    for magic, at, mime in _MAGIC:
        if raw[at : at + len(magic)] == magic and (at == 0 or raw[:4] == b"RIFF"):
            return mime
    return None


def check_image(block: Mapping[str, Any], limits: ImageLimits) -> tuple[str, str] | str:
    """Check a stored image block (``{"type": "image", "data": base64, "mimeType"}``) against
    ``limits``.

    Returns ``(media_type, base64 data)`` to send, or the text of a short note that stands in
    for an image the provider would refuse (a request carrying it would fail on every resume):
    empty or undecodable data, a format the provider does not take, or a size over its limit.
    The media type sent is the one the bytes carry (a PNG labelled ``image/jpg`` goes out as
    ``image/png``); base64 with line breaks is sent re-encoded without them.
    """
    declared = str(block.get("mimeType") or "unknown type")
    data = block.get("data")
    what = f"[image ({declared}) not sent to {limits.provider}:"
    if not isinstance(data, str) or not data.strip():
        return f"{what} its data is empty]"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        try:
            raw = base64.b64decode("".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            return f"{what} its data is not valid base64]"
        data = base64.b64encode(raw).decode("ascii")
    if not raw:
        return f"{what} its data is empty]"
    mime = sniff_image(raw)
    if mime is None or mime not in limits.media_types:
        return (
            f"{what} the data is not one of the formats it accepts "
            f"({', '.join(limits.media_types)})]"
        )
    if len(data) > limits.max_bytes:
        return (
            f"{what} {len(data) / 1e6:.1f} MB of base64 is over its "
            f"{limits.max_bytes / (1024 * 1024):.0f} MB limit per image]"
        )
    return mime, data


class WireIds:
    """Tool-call ids of one request, reduced to what a provider accepts and kept unique.

    ``reduce`` maps a stored id to an acceptable one (at most ``max_len`` characters); ids that
    collide once reduced get ``_2``, ``_3``... A call's wire id is fixed when its call block is
    converted (:meth:`call`), and its result looks it up (:meth:`result`), so the two always
    agree. Stored ids are unique within a context (``design/context.md`` rule 6).
    """

    def __init__(self, reduce: Callable[[str], str], max_len: int) -> None:
        self.reduce = reduce
        self.max_len = max_len
        self.by_id: dict[str, str] = {}
        self.used: set[str] = set()

    def call(self, call_id: str) -> str:
        """The wire id for the call block with stored id ``call_id``."""
        base = self.reduce(call_id)
        wire, n = base, 1
        while wire in self.used:
            n += 1
            suffix = f"_{n}"
            wire = base[: self.max_len - len(suffix)] + suffix
        self.used.add(wire)
        self.by_id[call_id] = wire
        return wire

    def result(self, call_id: str) -> str:
        """The wire id for a result naming ``call_id`` (its call's, else ``reduce(call_id)``)."""
        return self.by_id.get(call_id) or self.reduce(call_id)


def shorten_id(call_id: str, max_len: int) -> str:
    """``call_id`` itself when it fits ``max_len`` characters, else a prefix plus 8 hex digits
    of its SHA-256 (stable: the same id always shortens the same way)."""
    if 0 < len(call_id) <= max_len:
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{call_id[: max_len - 9]}_{digest}" if call_id else f"call_{digest}"
