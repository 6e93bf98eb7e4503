"""Providers behind one protocol (:mod:`.base`): scripted, OpenAI-compatible, Anthropic.

:func:`make_provider` builds one from a spec string, the form the CLI takes and the form a
``run_started`` record keeps (so ``resume`` can rebuild the same provider). A spec never
carries a credential: keys come from the environment.
"""

from __future__ import annotations

import os
from typing import Any

from durable_harness.errors import FormatError, MissingCredential
from durable_harness.providers.base import Provider
from durable_harness.providers.scripted import ScriptedProvider

__all__ = [
    "CREDENTIAL_ENV",
    "WIRE_FORMATS",
    "Provider",
    "ScriptedProvider",
    "make_provider",
    "require_credentials",
    "wire_messages",
]

CREDENTIAL_ENV: dict[str, str] = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
"""The environment variable holding each network provider's API key (one place)."""


def require_credentials(spec: str) -> None:
    """Check, before anything is written, that the provider named by ``spec`` has its API key.

    A scripted provider needs none. Call it where a missing key should stop a command before it
    creates a session (the CLI's ``run`` and ``resume``); the providers themselves still refuse a
    request without a key.

    Raises:
        MissingCredential: the provider's environment variable (``details['env']``) is unset
            or empty.
    """
    scheme = spec.partition(":")[0]
    env = CREDENTIAL_ENV.get(scheme)
    if env is not None and not os.environ.get(env, "").strip():
        raise MissingCredential(
            f"provider {spec!r} needs an API key: set the environment variable {env} "
            "(nothing was created)",
            env=env,
            provider=scheme,
        )


def make_provider(spec: str) -> Provider:
    """Build a provider from ``spec``:

    * ``scripted:FILE``: the scripted provider (path made absolute);
    * ``openai:MODEL``: OpenAI-compatible chat completions (``OPENAI_BASE_URL``,
      ``OPENAI_API_KEY``);
    * ``anthropic:MODEL``: Anthropic Messages (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``).

    Raises:
        FormatError: unknown scheme or an unreadable script.
    """
    scheme, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise FormatError(
            f"provider spec {spec!r} needs the form NAME:ARG "
            "(scripted:FILE, openai:MODEL, anthropic:MODEL)"
        )
    if scheme == "scripted":
        return ScriptedProvider.from_file(os.path.abspath(rest))
    if scheme == "openai":
        from durable_harness.providers.openai_compat import OpenAIProvider

        return OpenAIProvider(rest)
    if scheme == "anthropic":
        from durable_harness.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider(rest)
    raise FormatError(f"unknown provider {scheme!r} in {spec!r}: use scripted, openai or anthropic")


def provider_spec(spec: str) -> str:
    """Normalise a spec for recording (a scripted file path made absolute)."""
    scheme, _, rest = spec.partition(":")
    return f"scripted:{os.path.abspath(rest)}" if scheme == "scripted" else spec


WIRE_FORMATS = ("anthropic", "openai")
"""The request formats :func:`wire_messages` converts to."""


def wire_messages(
    wire_format: str, messages: list[dict[str, Any]], *, model: str | None = None
) -> list[dict[str, Any]]:
    """Context messages as the ``messages`` of a request in ``wire_format`` would carry them:
    the provider's own converter (``anthropic``: :func:`to_anthropic_messages` with provider
    ``anthropic`` and ``model``, which decides whose thinking signatures are re-sent;
    ``openai``: :func:`to_openai_messages`, no system prompt).

    Raises:
        FormatError: an unknown ``wire_format``.
    """
    if wire_format == "anthropic":
        from durable_harness.providers.anthropic_provider import to_anthropic_messages

        return to_anthropic_messages(messages, provider="anthropic", model=model or "")
    if wire_format == "openai":
        from durable_harness.providers.openai_compat import to_openai_messages

        return to_openai_messages(messages)
    raise FormatError(
        f"unknown request format {wire_format!r}: use one of {', '.join(WIRE_FORMATS)}"
    )
