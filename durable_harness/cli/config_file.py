"""The model of ``durable-harness.toml`` (``design/cli.md``, "Settings"), apart from
:mod:`~durable_harness.cli.settings` so that only a command that finds a file imports pydantic
for it (``design/cli.md``, "Start-up")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ConfigFile(BaseModel):
    """The keys of ``durable-harness.toml`` (an unknown key is refused, naming it)::

    store = "sqlite:agent.db"        # as --store
    provider = "anthropic:claude-sonnet-4-5"  # as --provider, for new runs and sessions
    durability = "batch"             # as --durability
    mcp = "mcp.json"                 # as --mcp (a path, relative to this file)
    notify = ["https://hooks.example/dh"]  # as serve --notify (repeatable)
    """

    model_config = ConfigDict(extra="forbid")

    store: str | None = None
    provider: str | None = None
    durability: Literal["sync", "batch", "none"] | None = None
    mcp: str | None = None
    notify: list[str] = Field(default_factory=list)
