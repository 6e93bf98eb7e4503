"""The built-in tools, assembled: ``read_file``, ``write_file``, ``edit_file``, ``append_file``
(:mod:`durable_harness.tools.files`) and ``bash`` (:mod:`durable_harness.tools.bash`).

:func:`builtin_tools` is the one entry point. The names re-exported here stay importable from
this module for code written against it.
"""

from __future__ import annotations

from collections.abc import Iterable

from durable_harness.models.records import CommandRuntime as Runtime
from durable_harness.tools.base import OUTPUT_CAP_BYTES, Tool
from durable_harness.tools.bash import PTY_SIZE, BashArgs, BashTool
from durable_harness.tools.env import SECRET_NAME_PATTERNS, is_secret_name, tool_environment
from durable_harness.tools.files import (
    AppendFileArgs,
    AppendFileTool,
    EditFileArgs,
    EditFileTool,
    ReadFileArgs,
    ReadFileTool,
    WriteFileArgs,
    WriteFileTool,
)

__all__ = [
    "OUTPUT_CAP_BYTES",
    "SECRET_NAME_PATTERNS",
    "AppendFileArgs",
    "AppendFileTool",
    "BashArgs",
    "BashTool",
    "EditFileArgs",
    "EditFileTool",
    "ReadFileArgs",
    "ReadFileTool",
    "WriteFileArgs",
    "WriteFileTool",
    "builtin_tools",
    "is_secret_name",
    "tool_environment",
]


def builtin_tools(
    *,
    allow_env: Iterable[str] = (),
    runtime: Runtime = "pipe",
    pty_size: tuple[int, int] = PTY_SIZE,
) -> dict[str, Tool]:
    """Return one fresh instance of each built-in tool, keyed by tool name:
    ``read_file``, ``write_file``, ``edit_file``, ``append_file``, ``bash``.

    ``allow_env``: credential-like environment variables ``bash`` may still pass on;
    ``runtime``: how ``bash`` connects its commands, ``"pipe"`` or ``"pty"`` (a
    pseudo-terminal); ``pty_size``: the pty runtime's window ``(rows, columns)``, default
    24x80; all three :class:`~durable_harness.tools.bash.BashTool`'s. A host that lets a
    session choose the runtime records the choice and passes it back here on resume.

    Raises:
        ValueError: ``runtime`` is not ``"pipe"`` or ``"pty"``, or a bad ``pty_size``.
    """
    tools: list[Tool] = [
        ReadFileTool(),
        WriteFileTool(),
        EditFileTool(),
        AppendFileTool(),
        BashTool(allow_env=allow_env, runtime=runtime, pty_size=pty_size),
    ]
    return {tool.name: tool for tool in tools}
