"""Which provider and which model a run uses: one rule for every door.

A session remembers the spec a run recorded (``run_started.providerSpec``) and the model its
context names (:attr:`SessionContext.model`); a run may also be *given* a spec (``--provider``,
a host session's own). The rule (``design/run-loop.md``, "Provider and model"): 1. the spec
given wins, then the recorded one, then the default (a host's ``--provider``); 2. the session's
model is only reused with a provider of its own family (the provider ``name``), so a model is
never sent to a provider it does not belong to (``gpt-5.1`` to Anthropic).

:func:`choose_provider` decides the spec (CLI ``resume``, the host's generations, ACP through
the host); :func:`request_model` the model of each request (the harness). Both apply
:func:`same_family`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["given", "recorded", "default"]


def spec_family(spec: str) -> str:
    """The provider family a spec names: its scheme (``openai:gpt-5.1`` -> ``openai``)."""
    return spec.partition(":")[0]


def spec_model(spec: str) -> str | None:
    """The model a network spec names (``anthropic:claude-x`` -> ``claude-x``); ``None`` for a
    scripted spec (its argument is a file, its model the script's)."""
    scheme, _, rest = spec.partition(":")
    return rest or None if scheme in ("openai", "anthropic") else None


def same_family(provider_name: str, session_model: Mapping[str, Any] | None) -> bool:
    """True when ``session_model`` (``{"provider", "modelId"}``, as
    :attr:`~durable_harness.session.context.SessionContext.model` holds it) belongs to the
    provider named ``provider_name`` (a provider's ``name`` or a spec's family)."""
    if not session_model or not session_model.get("modelId"):
        return False
    return str(session_model.get("provider") or "") == provider_name


def request_model(
    provider_name: str, provider_model: str, session_model: Mapping[str, Any] | None
) -> str:
    """The model a request to this provider names: the session's model when it belongs to
    this provider (:func:`same_family`), else the provider's own ``provider_model``."""
    if session_model is not None and same_family(provider_name, session_model):
        return str(session_model["modelId"])
    return provider_model


@dataclass(frozen=True)
class ProviderChoice:
    """The provider a run uses.

    Attributes:
        spec: the provider spec to build (:func:`~durable_harness.providers.make_provider`).
        source: where it came from: ``given``, ``recorded`` or ``default``.
        model: the model its requests name: the session's when of the spec's family, else
            the spec's own (``None`` for a scripted spec outside the session's family: the
            script's model).
        ignored_model: the session's model when it was not reused (another family), so a
            front can say so; ``None`` otherwise.
    """

    spec: str
    source: Source
    model: str | None
    ignored_model: dict[str, str] | None = None


def choose_provider(
    given: str | None,
    recorded: str | None,
    session_model: Mapping[str, Any] | None = None,
    default: str | None = None,
) -> ProviderChoice | None:
    """Decide the provider spec and model of a (resumed) run: ``given`` wins, then the
    ``recorded`` spec, then ``default``; the session's model (``{"provider", "modelId"}``)
    is reused only with a spec of its family. ``None`` when no spec is known at all."""
    source: Source
    if given:
        spec, source = given, "given"
    elif recorded:
        spec, source = recorded, "recorded"
    elif default:
        spec, source = default, "default"
    else:
        return None
    family = spec_family(spec)
    own = spec_model(spec)
    if session_model is not None and same_family(family, session_model):
        return ProviderChoice(spec, source, str(session_model["modelId"]))
    ignored = (
        {"provider": str(session_model.get("provider")), "modelId": str(session_model["modelId"])}
        if session_model and session_model.get("modelId")
        else None
    )
    return ProviderChoice(spec, source, own, ignored)
