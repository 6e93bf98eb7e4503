"""Providers behind one protocol (:mod:`.base`): scripted, OpenAI-compatible, Anthropic.

:func:`make_provider` builds one from a spec string, the form the CLI takes and the form a
``run_started`` record keeps (so ``resume`` can rebuild the same provider). A spec never
carries a credential: keys come from the environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_harness.errors import FormatError, MissingCredential
from durable_harness.lazy import lazy_names
from durable_harness.providers.base import PRICE_KEYS, Provider
from durable_harness.providers.choice import spec_model

if TYPE_CHECKING:
    from durable_harness.providers.scripted import ScriptedProvider

__all__ = [
    "CREDENTIAL_ENV",
    "WIRE_FORMATS",
    "Provider",
    "ScriptedProvider",
    "make_provider",
    "parse_price",
    "pricing_for",
    "require_credentials",
    "wire_messages",
]

# the scripted provider's script models build pydantic's schemas: loaded on first use, so that
# importing the package (a CLI command that only reads sessions) does not (design/cli.md,
# "Start-up")
__getattr__ = lazy_names(
    __name__, {"ScriptedProvider": "durable_harness.providers.scripted"}, globals()
)

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


def make_provider(spec: str, price: Mapping[str, Any] | None = None) -> Provider:
    """Build a provider from ``spec`` (``price``: a price or price table of
    :func:`parse_price`, applied by :func:`pricing_for`; without one a network provider's
    cost is unknown, ``None``, never 0):

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
    pricing = pricing_for(price, spec)
    if scheme == "scripted":
        from durable_harness.providers.scripted import ScriptedProvider

        return ScriptedProvider.from_file(os.path.abspath(rest), pricing=pricing)
    if scheme == "openai":
        from durable_harness.providers.openai_compat import OpenAIProvider

        return OpenAIProvider(rest, pricing=pricing)
    if scheme == "anthropic":
        from durable_harness.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider(rest, pricing=pricing)
    raise FormatError(f"unknown provider {scheme!r} in {spec!r}: use scripted, openai or anthropic")


def parse_price(text: str) -> dict[str, Any]:
    """Parse ``--price``: ``INPUT,OUTPUT[,CACHE_READ[,CACHE_WRITE]]`` in USD per million
    tokens, or the path of a JSON price table: one price object (``{"input": 3, "output":
    15, "cacheRead": 0.3, "cacheWrite": 3.75}``) or one per model id (``{"claude-x": {...},
    "gpt-5.1": {...}}``). A token kind left unpriced makes a cost that needs it unknown.

    Raises:
        FormatError: not 2 to 4 non-negative numbers, an unreadable or malformed table (the
            message names the text or the file and the bad field).
    """
    if text.endswith(".json") or os.path.isfile(text):
        try:
            table = json.loads(Path(text).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot read the price table {text}: {exc}", path=text) from exc
        if not isinstance(table, dict) or not table:
            raise FormatError(f"price table {text} must be a JSON object", path=text)
        if all(not isinstance(v, dict) for v in table.values()):
            return _prices(table, f"price table {text}")
        return {str(m): _prices(p, f"price table {text}: {m}") for m, p in table.items()}
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if not 2 <= len(values) <= 4 or any(not v >= 0 for v in values):
        raise FormatError(
            f"price {text!r} must be INPUT,OUTPUT[,CACHE_READ[,CACHE_WRITE]] in USD per "
            "million tokens (non-negative numbers), or a JSON price table file"
        )
    return dict(zip(PRICE_KEYS, values, strict=False))


def _prices(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise FormatError(f"{where}: a price must be an object of {', '.join(PRICE_KEYS)}")
    out: dict[str, float] = {}
    for key, price in value.items():
        number = isinstance(price, int | float) and not isinstance(price, bool) and price >= 0
        if key not in PRICE_KEYS or not number:
            raise FormatError(
                f"{where}: {key!r} must be one of {', '.join(PRICE_KEYS)} with a "
                f"non-negative number of USD per million tokens, not {price!r}"
            )
        out[key] = float(price)
    return out


def pricing_for(price: Mapping[str, Any] | None, spec: str) -> dict[str, float] | None:
    """The prices a provider built from ``spec`` charges: ``price`` itself when it is one
    price object, its entry for the spec's model when it is a table by model (a scripted
    spec takes a table's only entry, if it has one), else ``None`` (cost unknown)."""
    if not price:
        return None
    if all(not isinstance(v, Mapping) for v in price.values()):
        return {k: float(v) for k, v in price.items()}
    model = spec_model(spec)
    entry = price.get(model) if model else None
    if entry is None and model is None and len(price) == 1:
        entry = next(iter(price.values()))
    return {k: float(v) for k, v in entry.items()} if isinstance(entry, Mapping) else None


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
    ``openai``: :func:`to_openai_messages` with provider ``openai`` and ``model``, which
    decides whose thinking goes as text; no system prompt).

    Raises:
        FormatError: an unknown ``wire_format``.
    """
    if wire_format == "anthropic":
        from durable_harness.providers.anthropic_provider import to_anthropic_messages

        return to_anthropic_messages(messages, provider="anthropic", model=model or "")
    if wire_format == "openai":
        from durable_harness.providers.openai_compat import to_openai_messages

        return to_openai_messages(messages, provider="openai", model=model)
    raise FormatError(
        f"unknown request format {wire_format!r}: use one of {', '.join(WIRE_FORMATS)}"
    )
