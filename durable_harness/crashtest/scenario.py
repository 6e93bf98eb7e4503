"""Crash scenarios as data: ``crash_scenarios/<name>.json``.

A scenario file::

    {"name": str, "description": str,
     "files": {"relative/path": "content"},          # laid out in the fresh working dir
     "turns": [...], "by_prompt": {...},             # the scripted provider's script
     "context_window": tokens,                       # optional: the provider's window
     "steps": [{"op": "prompt" | "steer" | "follow_up" | "next_run" | "wait" | "abort" |
                      "set_model" | "navigate" | "compact" | "create_lane",
                "lane": "main", "text": ..., "on": "<event type>"...}]}

Side effects worth counting go to ``effects.log`` in the working directory, one tag a line
(``echo TAG >> effects.log`` or ``append_file`` of ``TAG\\n``), so a run can prove that no
``replay: "never"`` tool took effect twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_harness.errors import FormatError
from durable_harness.storage import codec

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


def default_dir() -> Path:
    """The repository's ``crash_scenarios/`` folder (beside the package)."""
    return Path(__file__).resolve().parents[2] / "crash_scenarios"


def load(path: str | Path) -> Scenario:
    """Load and check one scenario file.

    Raises:
        FormatError: unreadable, or a step with an unknown op (names the file).
    """
    try:
        data = codec.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise FormatError(f"cannot read scenario {path}: {exc}") from exc
    steps = data.get("steps") or []
    window = data.get("context_window")
    if window is not None and (not isinstance(window, int) or window <= 0):
        raise FormatError(f"scenario {path}: context_window must be a positive integer")
    for i, step in enumerate(steps):
        if step.get("op") not in OPS:
            raise FormatError(f"scenario {path}: step {i} has unknown op {step.get('op')!r}")
    return Scenario(
        name=str(data.get("name") or Path(path).stem),
        description=str(data.get("description", "")),
        steps=steps,
        turns=list(data.get("turns") or []),
        by_prompt=dict(data.get("by_prompt") or {}),
        files=dict(data.get("files") or {}),
        path=str(path),
        context_window=window if isinstance(window, int) else None,
    )


def load_all(folder: str | Path | None = None, names: list[str] | None = None) -> list[Scenario]:
    """Load every scenario of ``folder`` (default :func:`default_dir`), or those in ``names``.

    Raises:
        FormatError: a named scenario does not exist, or the folder is missing.
    """
    root = Path(folder) if folder else default_dir()
    if not root.is_dir():
        raise FormatError(f"no scenario folder at {root}; pass --scenarios DIR")
    found = {load(p).name: load(p) for p in sorted(root.glob("*.json"))}
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise FormatError(f"unknown scenario(s) {missing}; have {sorted(found)}")
        return [found[n] for n in names]
    return list(found.values())


_ECHO = re.compile(r"echo\s+(\S+)\s*>>\s*effects\.log")


def effect_tag(tool_name: str, arguments: dict[str, Any]) -> str | None:
    """The ``effects.log`` tag a tool call writes, if it writes one."""
    if tool_name == "bash":
        m = _ECHO.search(str(arguments.get("command", "")))
        return m.group(1) if m else None
    if tool_name == "append_file" and arguments.get("path") == "effects.log":
        return str(arguments.get("content", "")).strip() or None
    return None
