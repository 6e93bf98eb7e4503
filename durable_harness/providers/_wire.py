"""What the network providers share: :class:`NetworkProvider` (settings, the SDK client, the
stream's skeleton, error mapping, the final message), parsing streamed tool arguments, checking
an image against what a provider accepts, and tool-call ids a provider accepts. What a failure
means (retryable or not) is :mod:`durable_harness.providers.failures`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, Unpack, cast

import anyio

from durable_harness.errors import ProviderError
from durable_harness.providers.base import Done, ProviderEvent, ProviderRequest
from durable_harness.providers.failures import (
    error_body,
    idle_timeout_setting,
    retry_after,
    retryable_error_type,
    retryable_status,
    scrub,
    stream_broken,
    stream_ended_early,
)


class Settings(TypedDict, total=False):
    """The keyword arguments every network provider takes (:class:`NetworkProvider`)."""

    base_url: str | None
    api_key: str | None
    timeout: float
    idle_timeout: float | None
    pricing: Mapping[str, float] | None
    reasoning: bool


@dataclass
class WireStream:
    """What one streamed answer has delivered so far; a provider's subclass folds the SDK's
    events into it (:meth:`feed`) and says what the answer is once the stream ended.

    Attributes:
        provider: the provider's name (for errors).
        model: the model the answer names (the request's until the wire names one).
        received: events read so far.
        ended: the wire's end marker arrived (only then is the stream an answer).
        stop: the wire's own stop (finish) reason, if it sent one.
        content: the answer's content blocks.
    """

    provider: str
    model: str
    received: int = 0
    ended: bool = False
    stop: str | None = None
    content: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, event: dict[str, Any]) -> Iterator[ProviderEvent]:
        """Fold one wire event (the SDK object's ``model_dump()``); yield what it delivers."""
        raise NotImplementedError

    def finish(self) -> Iterator[ProviderEvent]:
        """Complete :attr:`content` once the stream ended; yield what only then is known."""
        return iter(())

    def usage(self, pricing: Mapping[str, float] | None) -> dict[str, Any]:
        """The answer's usage in pi's shape (tokens; cost in USD from ``pricing``)."""
        raise NotImplementedError


class NetworkProvider:
    """A :class:`~durable_harness.providers.base.Provider` over an official SDK's streaming
    API: the base of :class:`~durable_harness.providers.anthropic_provider.AnthropicProvider`
    and :class:`~durable_harness.providers.openai_compat.OpenAIProvider`.

    Args:
        model: default model id (a request's non-empty ``model`` overrides it).
        name: provider name written on assistant messages.
        context_window: the model's context window in tokens (drives auto-compaction).
        base_url: API root; falls back to the provider's ``*_BASE_URL`` environment variable,
            then the SDK default.
        api_key: the API key; falls back to the provider's ``*_API_KEY`` variable
            (:data:`~durable_harness.providers.CREDENTIAL_ENV`). Never appears in errors.
            Because a key is always passed explicitly, the SDK never loads profiles from disk.
        timeout: seconds allowed for each phase of a request: connecting, sending, waiting
            for a pooled connection, and each read (default 600).
        idle_timeout: seconds the server may stay silent while the request waits for its
            answer or its stream runs: each read of the connection, at most ``timeout``
            (keep-alives reset it). ``None`` takes ``DURABLE_HARNESS_STREAM_IDLE_TIMEOUT``,
            else 300 (the default of OpenAI Codex's ``stream_idle_timeout_ms``). Past it the
            attempt fails with reason ``stream_idle_timeout`` (retryable).
        pricing: USD per million tokens, keys ``input``, ``output``, ``cacheRead``,
            ``cacheWrite``; ``None``: every cost is unknown.
        reasoning: ask for the model's reasoning from the request's ``thinking_level``.

    The SDK client never retries (``max_retries=0``): the harness does, writing one
    ``provider_request_started`` record per attempt (:mod:`~durable_harness.providers.failures`
    is the rule it applies).

    Raises:
        FormatError: ``idle_timeout`` (or its environment variable) is not a positive number.
    """

    #: the SDK module (``anthropic``, ``openai``): its ``Timeout`` and error classes
    sdk: ClassVar[Any]
    #: the SDK's base error, and the errors of a connection breaking mid-stream
    sdk_error: ClassVar[type[Exception]]
    broken: ClassVar[tuple[type[BaseException], ...]]
    key_env: ClassVar[str]
    url_env: ClassVar[str]
    #: the wire's end marker, as a truncation error names it
    end_marker: ClassVar[str]
    #: the wire's stop reasons in pi's words, and the ``errorMessage`` some of them carry
    stop_reasons: ClassVar[Mapping[str, str]]
    stop_errors: ClassVar[Mapping[str, str]]

    def __init__(
        self, model: str, *, name: str, context_window: int, **settings: Unpack[Settings]
    ) -> None:
        self.name = name
        self.model = model
        self.context_window = context_window
        self.base_url = settings.get("base_url") or os.environ.get(self.url_env) or None
        self._api_key = settings.get("api_key") or os.environ.get(self.key_env) or None
        self.timeout = settings.get("timeout", 600.0)
        self.idle_timeout = idle_timeout_setting(settings.get("idle_timeout"))
        self.read_timeout = min(self.timeout, self.idle_timeout)
        pricing = settings.get("pricing")
        self.pricing = dict(pricing) if pricing else None
        self.reasoning = settings.get("reasoning", False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    def build_params(self, request: ProviderRequest) -> dict[str, Any]:
        """The keyword arguments of the SDK's streaming call for ``request``."""
        raise NotImplementedError

    def _open(self, **options: Any) -> Any:
        """A new SDK client built with ``options``."""
        raise NotImplementedError

    async def _create(self, client: Any, params: dict[str, Any]) -> Any:
        """Start the streaming request; returns the SDK's stream."""
        raise NotImplementedError

    def _wire(self, model: str) -> WireStream:
        """A fresh :class:`WireStream` for one answer."""
        raise NotImplementedError

    def _client(self) -> Any:
        if not self._api_key:
            raise ProviderError(
                f"{self.name}: no API key (pass api_key= or set {self.key_env})",
                retryable=False,
                provider=self.name,
            )
        timeout = self.sdk.Timeout(self.timeout, read=self.read_timeout)
        return self._open(
            api_key=self._api_key, base_url=self.base_url, timeout=timeout, max_retries=0
        )

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Stream the answer to ``request``: deltas and tool calls, then one :class:`Done`.

        The ``Done`` message is ``{"role": "assistant", "content": [thinking | text | toolCall
        blocks], "provider", "model", "usage": {input, output, cacheRead, cacheWrite,
        totalTokens (tokens), cost{input, output, cacheRead, cacheWrite, total} (USD) or
        None}, "stopReason": "stop" | "length" | "toolUse" | "error", "timestamp" (Unix ms)}``.

        Only a stream that delivered its end marker is an answer: one that ends without it
        (cleanly, or by a dropped or reset connection, a tool call's arguments cut mid-way
        included) fails with ``details["reason"] == "stream_truncated"``, one silent for
        ``idle_timeout`` with ``"stream_idle_timeout"``; both retryable, and no :class:`Done`
        is yielded (what was already yielded is no answer). The SDK's stream, then its
        client, are closed (shielded) however the iteration ends.

        Raises:
            ProviderError: ``retryable`` follows the one rule in
                :mod:`~durable_harness.providers.failures` (408, 409, 429, 5xx, connection
                failures, timeouts, a cut stream, mid-stream server errors: retryable); a
                missing key and unparseable tool arguments of a complete answer are not
                retryable. ``status`` holds the HTTP status when known.
        """
        client = self._client()
        try:
            params = self.build_params(request)
            wire = self._wire(str(params["model"]))
            try:
                stream = await self._create(client, params)
            except self.sdk_error as exc:
                raise self._error(exc) from None
            items = stream.__aiter__()
            try:
                try:
                    async for raw in items:
                        wire.received += 1
                        for event in wire.feed(cast(Any, raw).model_dump()):
                            yield event
                finally:
                    with anyio.CancelScope(shield=True):
                        if getattr(items, "aclose", None) is not None:
                            await items.aclose()
                        await stream.close()
            except self.broken as exc:
                raise stream_broken(
                    exc, self.name, self._api_key, wire.received, self.read_timeout
                ) from None
            except self.sdk_error as exc:  # an error event inside the stream
                raise self._error(exc) from None
            if not wire.ended:  # cut short: never an answer, whatever arrived
                raise stream_ended_early(self.name, self.end_marker, wire.received)
            for event in wire.finish():
                yield event
            yield Done(self._message(wire))
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    def _message(self, wire: WireStream) -> dict[str, Any]:
        stop = self.stop_reasons.get(wire.stop or "", "stop")
        if stop == "stop" and any(b["type"] == "toolCall" for b in wire.content):
            stop = "toolUse"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": wire.content,
            "provider": self.name,
            "model": wire.model,
            "usage": wire.usage(self.pricing),
            "stopReason": stop,
            "timestamp": int(time.time() * 1000),
        }
        if wire.stop is not None and wire.stop in self.stop_errors:
            message["errorMessage"] = self.stop_errors[wire.stop]
        return message

    def _error(self, exc: Exception) -> ProviderError:
        """Translate an SDK error into :class:`ProviderError` (message redacted)."""
        sdk = self.sdk
        details: dict[str, Any] = {"provider": self.name}
        status: int | None = None
        where = type(exc).__name__
        if isinstance(exc, sdk.APITimeoutError):
            retryable, detail = True, "request timed out"
        elif isinstance(exc, sdk.APIConnectionError):
            cause = exc.__cause__
            retryable = True
            detail = f"connection error ({type(cause).__name__})" if cause else "connection error"
        elif isinstance(exc, sdk.APIError):
            etype, text = error_body(exc.body)
            if etype:
                details["error_type"] = etype
            request_id = getattr(exc, "request_id", None)
            if request_id:
                details["request_id"] = str(request_id)
            code = getattr(exc, "status_code", None)
            if isinstance(code, int) and code >= 400:
                status = code
                response = exc.response
                retryable = retryable_status(status, response.headers)
                where = f"HTTP {status}"
                after = retry_after(response)
                if after is not None:
                    details["retry_after"] = after
            else:  # an error event inside a stream that began with HTTP 200
                retryable = retryable_error_type(etype)
                where = "error during streaming"
            detail = f"{etype}: {text}" if etype and text else etype or text
            if status is None:
                detail = detail or exc.message
        else:
            retryable, detail = False, str(exc)
        message = f"{self.name}: {where}: {detail}" if detail else f"{self.name}: {where}"
        return ProviderError(
            scrub(message, self._api_key), retryable=retryable, status=status, **details
        )


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
