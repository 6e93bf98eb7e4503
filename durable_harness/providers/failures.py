"""What a failed provider request means: whether sending it again may succeed, and the parts
of an error answer worth keeping. One rule for every network provider.

The providers switch their SDK's own retries off (``max_retries=0``) because the harness
retries, writing one ``provider_request_started`` record per attempt. The retry rule the
harness applies is therefore the SDKs' own (``_should_retry`` in ``openai-python`` and
``anthropic-sdk-python``, the same in both), kept here in one place:

1. A response header ``x-should-retry: true`` or ``false`` is the server's explicit answer and
   wins (:func:`retryable_status`).
2. Otherwise HTTP 408 (request timeout), 409 (conflict: a lock timeout), 429 (rate limited) and
   every 5xx (Anthropic's 529 "overloaded" included) are retryable; any other status is not.
3. No HTTP answer at all (connection refused or dropped, a timeout, the body stream cut off
   mid-way: :data:`TRANSPORT_ERRORS`) is retryable.
4. An error event inside a stream that began with HTTP 200 carries an error ``type``, not a
   status. The type is mapped to the status its provider documents for it
   (:data:`ERROR_TYPE_STATUS`: Anthropic's "Errors" page, OpenAI's ``server_error``), then
   rule 2 decides. A type neither documents, or none, is retryable: the server had accepted
   the request and broke off without blaming it, and the harness's durable attempt cap bounds
   the retries (:func:`retryable_error_type`).

A missing API key and tool arguments that are not a JSON object are never retryable; the
providers raise those themselves.

A stream is an answer only once its end marker arrived: OpenAI's ``finish_reason`` (the chunk
that carries it), Anthropic's ``message_stop``. A stream that ends without it, cleanly or by a
connection drop or reset, failed with ``details["reason"]`` :data:`STREAM_TRUNCATED`
(:func:`stream_ended_early`, :func:`stream_broken`); one that went silent for the provider's
``idle_timeout`` failed with :data:`STREAM_IDLE_TIMEOUT`. Both are retryable (rule 3: no
complete answer came) and nothing of the partial answer is kept: the harness records the
reason in ``provider_request_failed.reason`` and retries under the durable attempt cap
(``design/providers-and-tools.md``, "A stream is an answer only when it ends").
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from durable_harness.errors import FormatError, ProviderError, redact
from durable_harness.providers.base import STREAM_IDLE_TIMEOUT, STREAM_TRUNCATED

DEFAULT_IDLE_TIMEOUT = 300.0
"""Seconds a stream may stay silent before it counts as dead: the default of OpenAI Codex's
``stream_idle_timeout_ms`` (300000). Servers send keep-alives while a model thinks (Anthropic's
``ping`` events), which reset the clock."""

IDLE_TIMEOUT_ENV = "DURABLE_HARNESS_STREAM_IDLE_TIMEOUT"
"""The environment variable setting the idle timeout (seconds) of a provider built without
``idle_timeout=`` (how the CLI and the host take it)."""

RETRYABLE_STATUSES: frozenset[int] = frozenset({408, 409, 429})
"""The 4xx statuses worth a retry (rule 2); every status from 500 up is retryable too."""

ERROR_TYPE_STATUS: Mapping[str, int] = {
    # Anthropic, "Errors" (HTTP errors): each error type and the status it comes with.
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
    # OpenAI: the type of its 500 "server_error" answers (client faults share Anthropic's
    # "invalid_request_error").
    "server_error": 500,
}
"""Error ``type`` -> the HTTP status the provider documents for it (rule 4)."""


def retryable_status(status: int, headers: Mapping[str, str] | None = None) -> bool:
    """True when an HTTP error answer with ``status`` may succeed if sent again (rules 1-2).

    ``headers``: the answer's headers (case-insensitive mapping such as ``httpx.Headers``, or
    a plain dict with lower-case names); an ``x-should-retry`` of ``true``/``false`` wins.
    """
    if headers is not None:
        explicit = headers.get("x-should-retry")
        if explicit == "true":
            return True
        if explicit == "false":
            return False
    return status in RETRYABLE_STATUSES or status >= 500


def retryable_error_type(error_type: str | None) -> bool:
    """True when a mid-stream error event of ``error_type`` may succeed if sent again (rule
    4): the documented status of the type decides; an unknown or missing type is retryable."""
    status = ERROR_TYPE_STATUS.get(error_type or "")
    return True if status is None else retryable_status(status)


def error_body(body: object) -> tuple[str, str]:
    """``(error type, message)`` of an SDK error body: ``{"error": {"type", "message"}}``,
    the inner object alone, or raw text; a JSON object without a message gives its JSON text
    as the message. Either part may be ``""``; the message is cut to 500 characters (it is
    recorded and shown, not parsed)."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if not isinstance(inner, Mapping):
            return "", str(inner)[:500]
        message = inner.get("message")
        text = str(message) if message else json.dumps(body, default=str)
        return str(inner.get("type") or ""), text[:500]
    return "", "" if body is None else str(body)[:500]


def retry_after(response: Any) -> float | None:
    """The ``retry-after`` header of an HTTP response, in seconds, or ``None`` when absent or
    not a number (an HTTP date is not read)."""
    try:
        value = response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


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
"""The HTTP libraries' transport failures that reach a provider unwrapped (rule 3)."""


def idle_timeout_setting(value: float | None) -> float:
    """The idle timeout in seconds: ``value`` when given, else :data:`IDLE_TIMEOUT_ENV` when
    set and non-empty, else :data:`DEFAULT_IDLE_TIMEOUT`.

    Raises:
        FormatError: the value (given or from the environment) is not a positive finite number
            of seconds (the message names the variable).
    """
    source = "idle_timeout"
    if value is None:
        text = os.environ.get(IDLE_TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_IDLE_TIMEOUT
        source = f"environment variable {IDLE_TIMEOUT_ENV}"
        try:
            value = float(text)
        except ValueError:
            value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise FormatError(
            f"{source} must be a positive number of seconds, not {value!r}",
            setting=IDLE_TIMEOUT_ENV if source != "idle_timeout" else "idle_timeout",
        )
    return float(value)


def stream_ended_early(provider: str, missing: str, received: int) -> ProviderError:
    """The failure of a stream that ended without its end marker ``missing`` (``finish_reason``,
    ``message_stop``) after ``received`` events: retryable, ``reason``
    :data:`STREAM_TRUNCATED`, no ``status``."""
    return ProviderError(
        f"{provider}: the stream ended after {received} event(s) without {missing}: "
        "the answer is incomplete",
        retryable=True,
        provider=provider,
        reason=STREAM_TRUNCATED,
    )


def stream_broken(
    exc: BaseException, provider: str, secret: str | None, received: int, idle_timeout: float
) -> ProviderError:
    """The failure of a stream whose connection broke after the HTTP 200 answer: a read timeout
    (``idle_timeout`` seconds of silence, the provider's read timeout: reason
    :data:`STREAM_IDLE_TIMEOUT`) or a dropped or
    reset connection (reason :data:`STREAM_TRUNCATED`). ``exc`` is the ``httpx``/``httpx2``
    transport error or the SDK's ``APIConnectionError``/``APITimeoutError`` wrapping one;
    always ``retryable=True`` (rule 3), no ``status``."""
    chain = [exc]
    while len(chain) < 8 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
    names = [type(e).__name__ for e in chain]
    shown = chain[1] if len(chain) > 1 else exc  # the HTTP library's error under the SDK's
    detail = next((str(e).strip() for e in reversed(chain) if str(e).strip()), "")[:200]
    cause = f"{type(shown).__name__}: {detail}" if detail else type(shown).__name__
    if any("Timeout" in name for name in names):
        reason = STREAM_IDLE_TIMEOUT
        what = f"the stream timed out: nothing received for {idle_timeout:g} s"
    else:
        reason = STREAM_TRUNCATED
        what = "the connection was lost mid-stream"
    message = f"{provider}: {what} after {received} event(s) ({cause}): the answer is incomplete"
    return ProviderError(
        scrub(message, secret), retryable=True, status=None, provider=provider, reason=reason
    )
