"""Providers behind one protocol (:mod:`.base`): scripted, OpenAI-compatible, Anthropic.

:func:`make_provider` builds one from a spec string, the form the CLI takes and the form a
``run_started`` record keeps (so ``resume`` can rebuild the same provider). A spec never
carries a credential: keys come from the environment.
"""

from __future__ import annotations

import os

from durable_harness.errors import FormatError
from durable_harness.providers.base import Provider
from durable_harness.providers.scripted import ScriptedProvider

__all__ = ["Provider", "ScriptedProvider", "make_provider"]


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
