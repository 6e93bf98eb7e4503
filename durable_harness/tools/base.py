"""The tool protocol: a name, a pydantic argument model, a replay declaration, and two verbs.

* :meth:`Tool.execute` performs the effect. It is called only after the ``tool_started``
  intent is durable, and is cancelled through anyio cancel scopes on abort.
* :meth:`Tool.reconcile` (optional) establishes, after a crash, whether an in-doubt call took
  effect. It returns a :class:`ToolResult` when it can tell, or ``None`` when it cannot.

``replay="safe"`` declares that running the tool again has no effect beyond the first run
(``read_file``); ``"never"`` that it must not be re-run blindly (``bash``, writes). Recovery
re-executes an in-doubt call only when both the recorded intent and the current declaration
say ``safe``, or when ``reconcile`` answers.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from durable_harness.errors import ToolError
from durable_harness.fs import resolve_path
from durable_harness.providers.base import ToolSpec

__all__ = [
    "OUTPUT_CAP_BYTES",
    "Replay",
    "StrictArgs",
    "Tool",
    "ToolContext",
    "ToolResult",
    "resolve_path",
]

Replay = Literal["safe", "never"]

OUTPUT_CAP_BYTES = 256 * 1024
"""Most bytes (UTF-8) of file text or command output a single built-in tool result carries:
256 KiB."""


ABORT_GRACE = 1.0
"""Seconds a cancelled tool is given to stop (SIGTERM to SIGKILL) on a plain abort."""


class StrictArgs(BaseModel):
    """The base of the built-in tools' argument models: an unknown argument is refused."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class ToolContext:
    """What a tool call knows about where it runs.

    Attributes:
        cwd: the session's working directory; tool paths resolve inside it.
        run_id: the run's id.
        tool_call_id: the provider's id for this call.
        idempotency_key: ``"<run_id>:<call key>"`` (unique per call in the run), stable across
            restarts, for tools that call external services able to deduplicate a retry.
        env: extra environment for subprocesses.
        on_process: called with a started subprocess's process-group id, so the harness
            records it (recovery kills a group a dead harness left before deciding the call).
        stop_grace: the seconds a cancelled tool has to stop its processes, read when the
            cancellation comes (``None``: ``ABORT_GRACE``; a host's close: ``close_grace``).
    """

    cwd: Path
    run_id: str
    tool_call_id: str
    idempotency_key: str
    env: dict[str, str] = field(default_factory=dict)
    on_process: Callable[[int], None] | None = None
    stop_grace: Callable[[], float] | None = None

    def grace(self) -> float:
        """Seconds a cancelled tool has to stop before it kills (see ``stop_grace``)."""
        return self.stop_grace() if self.stop_grace is not None else ABORT_GRACE


@dataclass
class ToolResult:
    """A tool's outcome: ``content`` blocks (``{"type": "text", "text": ...}``), ``is_error``,
    and ``details`` (JSON, kept on the entry, never sent to the provider)."""

    content: list[dict[str, Any]]
    is_error: bool = False
    details: dict[str, Any] | None = None

    @classmethod
    def text(
        cls, text: str, *, is_error: bool = False, details: dict[str, Any] | None = None
    ) -> ToolResult:
        """Build a result holding one text block."""
        return cls([{"type": "text", "text": text}], is_error=is_error, details=details)


class Tool(abc.ABC):
    """Base class of every tool. Subclasses set the class attributes and :meth:`execute`."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    replay: ClassVar[Replay] = "never"

    def spec(self) -> ToolSpec:
        """Return what the provider sees: name, description and the JSON schema of ``Args``."""
        return ToolSpec(self.name, self.description, self.Args.model_json_schema())

    def parse_args(self, arguments: dict[str, Any]) -> BaseModel:
        """Validate raw arguments.

        Raises:
            ToolError: the arguments do not match ``Args`` (message names the tool).
        """
        try:
            return self.Args.model_validate(arguments)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ToolError(
                f"bad arguments for tool {self.name}: {first['loc']}: {first['msg']}",
                tool=self.name,
            ) from exc

    def intent_fields(self) -> dict[str, Any]:
        """Extra fields of this tool's ``tool_started`` intent, each declared on
        :class:`~durable_harness.models.records.ToolStarted` (an MCP tool's ``mcp``:
        ``design/mcp.md``); ``{}`` by default. They never replace the intent's own fields."""
        return {}

    @property
    def can_reconcile(self) -> bool:
        """True when this tool overrides :meth:`reconcile`."""
        return type(self).reconcile is not Tool.reconcile

    @abc.abstractmethod
    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Perform the effect and return its result; errors become ``is_error`` results."""

    async def reconcile(self, args: Any, ctx: ToolContext) -> ToolResult | None:
        """Establish an in-doubt call's outcome; ``None`` means it cannot be told."""
        return None
