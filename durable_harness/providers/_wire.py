"""What the network providers share: :class:`NetworkProvider` (settings, the SDK client, the
stream's skeleton, error mapping), :class:`WireStream` (usage, streamed tool arguments, the
final message), checking an image against what a provider accepts, and tool-call ids a
provider accepts. What a failure
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
from durable_harness.providers import CREDENTIAL_ENV
from durable_harness.providers.base import (
    Done,
    ProviderEvent,
    ProviderRequest,
    empty_usage,
    priced,
)
from durable_harness.providers.failures import (
    TRANSPORT_ERRORS,
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
    """The keyword arguments every network provider takes (:class:`NetworkProvider`).

    ``name`` (written on assistant messages; default: the provider's family), ``context_window``
    (tokens; drives auto-compaction), ``base_url`` (default: ``<FAMILY>_BASE_URL``, then the
    SDK's), ``api_key`` (default: the family's variable in
    :data:`~durable_harness.providers.CREDENTIAL_ENV`; never in errors, and always passed, so
    the SDK loads no profile from disk), ``timeout`` (seconds for each phase of a request;
    600), ``idle_timeout`` (seconds the server may stay silent, at most ``timeout``;
    keep-alives reset it; default ``DURABLE_HARNESS_STREAM_IDLE_TIMEOUT``, else 300, Codex's
    ``stream_idle_timeout_ms``; past it the attempt fails, retryable, with reason
    ``stream_idle_timeout``), ``pricing`` (USD per million tokens of ``input``, ``output``,
    ``cacheRead``, ``cacheWrite``; ``None``: costs unknown), ``reasoning`` (ask for the
    model's reasoning from the request's ``thinking_level``).
    """

    name: str
    context_window: int
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

    A subclass names its wire's end marker (:attr:`end_marker`, as a truncation error names
    it), its stop reasons in pi's words and the ``errorMessage`` some of them carry.
    """

    end_marker: ClassVar[str]
    stop_reasons: ClassVar[Mapping[str, str]]
    stop_errors: ClassVar[Mapping[str, str]]

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

    @staticmethod
    def tokens(
        pricing: Mapping[str, float] | None, read: int, write: int, **counts: int
    ) -> dict[str, Any]:
        """A usage dict of ``input`` and ``output`` (``counts``), ``read`` and ``write``
        cached tokens, their total, priced by ``pricing`` (:func:`~durable_harness.providers.
        base.priced`)."""
        usage = {**empty_usage(), **counts, "cacheRead": read, "cacheWrite": write}
        usage["totalTokens"] = usage["input"] + usage["output"] + read + write
        return priced(usage, pricing)

    def arguments(self, raw: str, name: object, call_id: object) -> dict[str, Any]:
        """Parse a streamed tool call's accumulated JSON arguments ``raw`` (blank means
        ``{}``).

        Raises:
            ProviderError: ``raw`` is not a JSON object (``retryable=False``; ``details``
                carry ``tool_call_id``): sending the request again would not change what was
                generated for the recorded context.
        """
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ProviderError(
                f"{self.provider}: tool call {name!r} has arguments that are not a JSON object",
                retryable=False,
                provider=self.provider,
                tool_call_id=call_id,
            )
        return value

    def message(self, name: str, pricing: Mapping[str, float] | None) -> dict[str, Any]:
        """The complete assistant message of provider ``name`` (see
        :meth:`NetworkProvider.stream`)."""
        stop = self.stop_reasons.get(self.stop or "", "stop")
        if stop == "stop" and any(b["type"] == "toolCall" for b in self.content):
            stop = "toolUse"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content,
            "provider": name,
            "model": self.model,
            "usage": self.usage(pricing),
            "stopReason": stop,
            "timestamp": int(time.time() * 1000),
        }
        if self.stop is not None and self.stop in self.stop_errors:
            message["errorMessage"] = self.stop_errors[self.stop]
        return message


class NetworkProvider:
    """A :class:`~durable_harness.providers.base.Provider` over an official SDK's streaming
    API (``model``: the default model id; the rest: :class:`Settings`), the base of
    :class:`~durable_harness.providers.anthropic_provider.AnthropicProvider` and
    :class:`~durable_harness.providers.openai_compat.OpenAIProvider`. The SDK client never
    retries (``max_retries=0``): the harness does, one ``provider_request_started`` record per
    attempt, by the rule of :mod:`~durable_harness.providers.failures`.

    Raises:
        FormatError: ``idle_timeout`` (or its environment variable) is not a positive number.
    """

    #: the provider family (``anthropic``, ``openai``): the default name, the variables read
    family: ClassVar[str]
    default_window: ClassVar[int]
    #: the SDK module (its ``Timeout``, client and error classes) and its base error
    sdk: ClassVar[Any]
    sdk_error: ClassVar[type[Exception]]
    client_class: ClassVar[Any]
    wire: ClassVar[type[WireStream]]

    def __init__(self, model: str, **settings: Unpack[Settings]) -> None:
        self.name = settings.get("name", self.family)
        self.model = model
        self.context_window = settings.get("context_window", self.default_window)
        self.key_env = CREDENTIAL_ENV[self.family]
        url_env = f"{self.family.upper()}_BASE_URL"
        self.base_url = settings.get("base_url") or os.environ.get(url_env) or None
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

    async def _create(self, client: Any, params: dict[str, Any]) -> Any:
        """Start the streaming request; returns the SDK's stream."""
        raise NotImplementedError

    def _client(self) -> Any:
        if not self._api_key:
            raise ProviderError(
                f"{self.name}: no API key (pass api_key= or set {self.key_env})",
                retryable=False,
                provider=self.name,
            )
        timeout = self.sdk.Timeout(self.timeout, read=self.read_timeout)
        return self.client_class(
            api_key=self._api_key, base_url=self.base_url, timeout=timeout, max_retries=0
        )

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Stream the answer to ``request``: deltas and tool calls, then one :class:`Done`
        (the message's shape: :mod:`~durable_harness.providers.base`; thinking blocks keep
        their signature as ``thinkingSignature``), only once the wire's end marker arrived.
        The SDK's stream, then its client, are closed (shielded) however the iteration ends.

        Raises:
            ProviderError: ``retryable`` by the one rule of
                :mod:`~durable_harness.providers.failures` (a cut or silent stream included,
                with its ``details["reason"]``); a missing key and unparseable tool arguments
                of a complete answer are not retryable. ``status``: the HTTP status, if any.
        """
        client = self._client()
        try:
            params = self.build_params(request)
            wire = self.wire(self.name, str(params["model"]))
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
            except (self.sdk.APIConnectionError, *TRANSPORT_ERRORS) as exc:
                raise stream_broken(
                    exc, self.name, self._api_key, wire.received, self.read_timeout
                ) from None
            except self.sdk_error as exc:  # an error event inside the stream
                raise self._error(exc) from None
            if not wire.ended:  # cut short: never an answer, whatever arrived
                raise stream_ended_early(self.name, wire.end_marker, wire.received)
            for event in wire.finish():
                yield event
            yield Done(wire.message(self.name, self.pricing))
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

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


@dataclass(frozen=True)
class ImageLimits:
    """What one provider accepts as a base64 image: ``media_types`` and ``max_bytes`` (the
    base64 text's length, in bytes: the stricter of the two readings of a size limit)."""

    provider: str
    media_types: tuple[str, ...]
    max_bytes: int


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
