"""The configuration file, ``durable-harness.toml``, and where each setting of a command came
from (``design/cli.md``, "Settings"): the command line, then the environment, then the file in
the working directory, then the file in ``$DURABLE_HARNESS_HOME`` (``~/.durable-harness``),
then the built-in default. ``--verbose`` prints each setting with its source."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable_harness.errors import FormatError
from durable_harness.storage import default_home

if TYPE_CHECKING:
    from durable_harness.cli.config_file import ConfigFile

CONFIG_NAME = "durable-harness.toml"
"""The file's name, looked for in the working directory and in the home folder."""


@dataclass
class Settings:
    """The settings a command runs with and their sources (``{name: source}``; a source is
    ``"--store"``-style for a flag, ``"$NAME"`` for the environment, a file's path, or
    ``"default"``)."""

    files: list[Path] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


def config_files(cwd: str | None = None) -> list[Path]:
    """The configuration files that exist, the working directory's first (it wins)."""
    places = [Path(cwd or os.getcwd()) / CONFIG_NAME, Path(default_home()) / CONFIG_NAME]
    seen: list[Path] = []
    for path in places:
        if path.is_file() and all(path.resolve() != p.resolve() for p in seen):
            seen.append(path)
    return seen


def read_config(path: Path) -> ConfigFile:
    """Parse and check one configuration file.

    Raises:
        FormatError: not TOML, or a key or value the file format does not have (the message
            names the file and the key).
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise FormatError(f"{path}: not a readable TOML file: {exc}", path=str(path)) from exc
    # the file's model (pydantic) is imported only when there is a file to check: a command
    # run without one starts about 0.15 s sooner (design/cli.md, "Start-up")
    from pydantic import ValidationError

    from durable_harness.cli.config_file import ConfigFile

    try:
        config = ConfigFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise FormatError(f"{path}: {key}: {first['msg']}", path=str(path), key=key) from exc
    if config.mcp is not None:  # relative to the file, as editors resolve their configs
        config.mcp = str((path.parent / config.mcp).resolve())
    return config


ENVIRONMENT = {"store": "DURABLE_HARNESS_STORE"}
"""The settings the environment can give, by variable."""

DEFAULTS: dict[str, Any] = {"durability": "sync", "notify": []}
"""The built-in defaults of settings a command needs a value for."""

RECORDED_FIRST = {"resume": {"provider"}, "branch-summary": {"provider"}}
"""Settings a command takes from the session before any file: a resumed run keeps the provider
it recorded unless ``--provider`` says otherwise (``design/run-loop.md``), so the file's
``provider``, which is for new runs and sessions, does not apply there."""

OTHER_MEANING = {"crash-test": {"durability"}}
"""Options that share a setting's name but mean something else: ``crash-test --durability``
chooses the power-cut modes under test (``design/crash-matrix.md``), not how a store syncs, so
no file or default fills it."""


def apply_settings(args: argparse.Namespace) -> Settings:
    """Fill the command's unset settings (``store``, ``provider``, ``durability``, ``mcp``,
    ``notify``: those of them the command has) from the environment and the configuration
    files, in that order, then the defaults; record each one's source on the result.

    Raises:
        FormatError: a configuration file is malformed.
    """
    settings = Settings(files=config_files())
    configs = [(str(p), read_config(p)) for p in settings.files]
    for name in ("store", "provider", "durability", "mcp", "notify"):
        skipped = RECORDED_FIRST.get(args.command, set()) | OTHER_MEANING.get(args.command, set())
        if not hasattr(args, name) or name in skipped:
            continue
        given = getattr(args, name)
        if given not in (None, []):
            source, value = f"--{name}", given
        elif name in ENVIRONMENT and os.environ.get(ENVIRONMENT[name]):
            source, value = f"${ENVIRONMENT[name]}", os.environ[ENVIRONMENT[name]]
        else:
            source, value = "default", DEFAULTS.get(name)
            for where, config in configs:
                found = getattr(config, name)
                if found not in (None, []):
                    source, value = where, found
                    break
        if not source.startswith("$"):  # the environment is read where it is used
            setattr(args, name, value)
        settings.sources[name], settings.values[name] = source, value
    return settings


def print_settings(settings: Settings) -> None:
    """``--verbose``: each setting and where it came from, on stderr."""
    files = ", ".join(map(str, settings.files)) or f"none ({CONFIG_NAME} here or in the home)"
    print(f"durable-harness: configuration files: {files}", file=sys.stderr)
    for name, source in settings.sources.items():
        value = settings.values[name]
        shown = "-" if value in (None, []) else value
        if isinstance(value, list) and value:  # values print as JSON, never a Python repr
            shown = json.dumps(value)
        if name == "store" and value is None:  # say which store the default is
            shown = f"jsonl:{default_home()}"
        if name == "store" and str(value).startswith("postgres"):
            from durable_harness.storage.postgres.connection import redact_dsn

            shown = redact_dsn(str(value))
        print(f"durable-harness: {name} = {shown} (from {source})", file=sys.stderr)
