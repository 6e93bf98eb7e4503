"""Crash scenarios as data: ``<folder>/<name>.json`` (built-in ones in ``crashtest/scenarios/``,
shipped as package data); the file format, the
``effects.log`` convention and how ``tools``/``provider`` import paths load are in
``design/testing-kit.md`` "Scenario files" and "Loading custom tools and providers"."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_harness.errors import FormatError, ImportSpecError
from durable_harness.providers.base import Provider
from durable_harness.providers.scripted import ScriptedProvider
from durable_harness.storage import codec
from durable_harness.tools.base import Tool
from durable_harness.tools.builtin import builtin_tools

OPS = (
    "prompt",
    "steer",
    "follow_up",
    "next_run",
    "wait",
    "abort",
    "set_model",
    "navigate",
    "compact",
    "create_lane",
)


@dataclass
class Scenario:
    """A loaded scenario (see the module docstring); ``path`` is its file."""

    name: str
    description: str
    steps: list[dict[str, Any]]
    turns: list[dict[str, Any]] = field(default_factory=list)
    by_prompt: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    path: str = ""
    context_window: int | None = None
    tools: str | None = None
    provider: str | None = None


def default_dir() -> Path:
    """The built-in scenarios' folder, ``durable_harness/crashtest/scenarios/``: package data,
    so an installed wheel has them as a clone does (``design/testing-kit.md``, "Scenario
    files")."""
    return Path(__file__).resolve().parent / "scenarios"


def load(path: str | Path) -> Scenario:
    """Load and check one scenario file.

    Raises:
        FormatError: unreadable, not a JSON object, a key of the wrong JSON type, or a step that
            is not an object or has an unknown op (names the file).
    """
    try:
        data = codec.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise FormatError(f"cannot read scenario {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise FormatError(f"scenario {path}: must be a JSON object, got {type(data).__name__}")
    for key, kind, name in _SHAPES:
        if data.get(key) is not None and not isinstance(data[key], kind):
            got = type(data[key]).__name__
            raise FormatError(f"scenario {path}: {key!r} must be a JSON {name}, got {got}")
    steps = data.get("steps") or []
    window = data.get("context_window")
    if window is not None and (not isinstance(window, int) or window <= 0):
        raise FormatError(f"scenario {path}: context_window must be a positive integer")
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise FormatError(f"scenario {path}: step {i} must be a JSON object")
        if step.get("op") not in OPS:
            raise FormatError(f"scenario {path}: step {i} has unknown op {step.get('op')!r}")
    for key in ("tools", "provider"):
        value = data.get(key)
        if value is not None and not (isinstance(value, str) and _SPEC.fullmatch(value)):
            raise FormatError(
                f"scenario {path}: {key!r} must be an import path 'module:function', got {value!r}"
            )
    return Scenario(
        name=str(data.get("name") or Path(path).stem),
        description=str(data.get("description", "")),
        steps=steps,
        turns=list(data.get("turns") or []),
        by_prompt=dict(data.get("by_prompt") or {}),
        files=dict(data.get("files") or {}),
        path=str(path),
        context_window=window if isinstance(window, int) else None,
        tools=data.get("tools"),
        provider=data.get("provider"),
    )


def load_all(folder: str | Path | None = None, names: list[str] | None = None) -> list[Scenario]:
    """Load every scenario of ``folder`` (default :func:`default_dir`), or those in ``names``.

    Raises:
        FormatError: a named scenario does not exist, or the folder is missing.
    """
    root = Path(folder) if folder else default_dir()
    if not root.is_dir():
        raise FormatError(f"no scenario folder at {root}; pass --scenarios DIR")
    found = {sc.name: sc for sc in map(load, sorted(root.glob("*.json")))}
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise FormatError(f"unknown scenario(s) {missing}; have {sorted(found)}")
        return [found[n] for n in names]
    return list(found.values())


_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_SHAPES = (  # a scenario file's keys that hold containers (design/testing-kit.md, "Scenario files")
    ("steps", list, "array"),
    ("turns", list, "array"),
    ("by_prompt", dict, "object"),
    ("files", dict, "object"),
)


def import_path() -> str:
    """Put the current working directory on ``sys.path`` (once) and return it: scenario code
    is importable from the folder the command runs in."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    return here


def load_object(spec: str, what: str) -> Any:
    """Import ``"module:function"`` (after :func:`import_path`) and return the function.

    Raises:
        ImportSpecError: malformed spec, module not importable, or no such callable (the
            message names the spec and ``what`` it was for).
    """
    if not _SPEC.fullmatch(spec):
        raise ImportSpecError(
            f"{what}: {spec!r} is not an import path 'module:function'", spec=spec
        )
    module_name, _, attr = spec.partition(":")
    import_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportSpecError(
            f"{what}: cannot import {module_name!r} for {spec!r} from {os.getcwd()}: {exc}",
            spec=spec,
        ) from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise ImportSpecError(f"{what}: {spec!r}: module has no function {attr!r}", spec=spec)
    return func


def scenario_tools(sc: Scenario) -> dict[str, Tool]:
    """The tools the scenario may call, keyed by name: its ``tools`` function's, or the built-ins.

    Raises:
        ImportSpecError: the function cannot be loaded, does not return a list of ``Tool``
            instances, or returns two tools of one name.
    """
    if sc.tools is None:
        return builtin_tools()
    made = load_object(sc.tools, f"scenario {sc.name} tools")()
    if not isinstance(made, list | tuple) or not all(isinstance(t, Tool) for t in made):
        raise _refused(
            sc, "tools", f"must return a list of Tool instances, got {type(made).__name__}"
        )
    out: dict[str, Tool] = {}
    for tool in made:
        if tool.name in out:
            raise _refused(sc, "tools", f"returns two tools named {tool.name!r}")
        out[tool.name] = tool
    return out


def _refused(sc: Scenario, key: str, why: str) -> ImportSpecError:
    spec = getattr(sc, key)
    return ImportSpecError(f"scenario {sc.name}: {key} function {spec!r} {why}", spec=spec)


def scenario_provider(sc: Scenario) -> Provider:
    """The scenario's provider: its ``provider`` function's, or the scripted one over its script.

    Raises:
        ImportSpecError: the function cannot be loaded or returns no ``Provider``.
    """
    if sc.provider is not None:
        made = load_object(sc.provider, f"scenario {sc.name} provider")()
        if not isinstance(made, Provider):
            raise _refused(sc, "provider", f"must return a Provider, got {type(made).__name__}")
        return made
    if sc.context_window is not None:
        return ScriptedProvider(sc.turns, by_prompt=sc.by_prompt, context_window=sc.context_window)
    return ScriptedProvider(sc.turns, by_prompt=sc.by_prompt)


def tool_effects(tools: dict[str, Tool], cwd: Path) -> Counter[str]:
    """Every effect count the tools' own ``count_effects(cwd)`` checks report, as
    ``"<tool>:<effect>"`` keys (tools without the hook report nothing)."""
    out: Counter[str] = Counter()
    for name, tool in sorted(tools.items()):
        check = getattr(tool, "count_effects", None)
        if callable(check):
            for effect, n in dict(check(cwd)).items():
                out[f"{name}:{effect}"] += int(n)
    return out


_ECHO = re.compile(r"echo\s+(\S+)\s*>>\s*effects\.log")


def effect_tag(tool_name: str, arguments: dict[str, Any]) -> str | None:
    """The ``effects.log`` tag a tool call writes, if it writes one."""
    if tool_name == "bash":
        m = _ECHO.search(str(arguments.get("command", "")))
        return m.group(1) if m else None
    if tool_name == "append_file" and arguments.get("path") == "effects.log":
        return str(arguments.get("content", "")).strip() or None
    return None
