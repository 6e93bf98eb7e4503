"""The scripted provider: deterministic answers from a JSON file, for tests, demos and the
crash matrix.

File format (design brief, section 4)::

    {"turns": [
        {"text": "I'll look.", "tool_calls": [{"name": "read_file", "arguments": {...}}],
         "usage": {"input": 100, "output": 20}, "fail_attempts": 0, "delay": 0.0,
         "chunks": 4}
    ]}

The k-th assistant message of a run gets turn k, so a restarted run continues where it was.
``"by_prompt": {"<prompt text>": [turns...]}`` gives a run whose prompt matches its own turns;
``"context_window": tokens`` the window the harness compacts against. Per turn:
``fail_attempts`` (the first n attempts fail with a retryable HTTP 503), ``delay`` (seconds
before each chunk), ``chunks`` (text deltas), ``wait_for`` (a path: after the first chunk the
stream waits until it exists, so a test holds a run open without guessing a delay). Tool call
ids are ``call_<last 4 of run id>_<turn>_<index>`` (stable across restarts). A turn past the
end answers ``"(script finished)"``; summary requests get a summary of the context's text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    StrictStr,
    ValidationError,
)

from durable_harness.errors import FormatError, ProviderError
from durable_harness.ids import now_ms
from durable_harness.models.content import text_of
from durable_harness.providers.base import (
    PRICE_KEYS,
    Done,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ToolCallEvent,
    empty_usage,
    priced,
)
from durable_harness.storage import codec


class _Cost(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: float = 0.0
    output: float = 0.0
    cacheRead: float = 0.0
    cacheWrite: float = 0.0
    total: float | None = None


class _Usage(BaseModel):
    model_config = ConfigDict(extra="allow")
    input: NonNegativeInt = 0
    output: NonNegativeInt = 0
    cacheRead: NonNegativeInt = 0
    cacheWrite: NonNegativeInt = 0
    totalTokens: NonNegativeInt | None = None
    cost: _Cost | None = None


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: StrictStr
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: StrictStr | None = None


class _Turn(BaseModel):
    """One scripted turn, as the module docstring describes it (unknown keys are allowed)."""

    model_config = ConfigDict(extra="allow")
    text: StrictStr = ""
    tool_calls: list[_ToolCall] | None = None
    usage: _Usage | None = None
    fail_attempts: NonNegativeInt = 0
    delay: NonNegativeFloat = 0.0
    chunks: PositiveInt = 2
    stop_reason: StrictStr = "stop"


def check_turn(turn: Any, where: str) -> None:
    """Check one scripted turn against the file format.

    Raises:
        FormatError: naming ``where``, the field (``usage.input``, ``tool_calls[0].name``) and
            the value found.
    """
    if not isinstance(turn, dict):
        raise FormatError(f"{where} is not an object")
    try:
        _Turn.model_validate(turn)
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:3]:
            field = "".join(
                f"[{part}]" if isinstance(part, int) else f".{part}" for part in err["loc"]
            ).lstrip(".")
            problems.append(f"{field}: {err['msg'].lower()} (got {err.get('input')!r})")
        raise FormatError(f"{where}: {'; '.join(problems)}", fields=problems) from None


class ScriptedProvider:
    """A :class:`~durable_harness.providers.base.Provider` that plays a script.

    Args:
        turns: the ``turns`` list of the file format above.
        model: model id to record; ``context_window`` in tokens.
        pricing: USD per million tokens (keys ``input``, ``output``, ``cacheRead``,
            ``cacheWrite``) for turns whose ``usage`` gives no ``cost``; without it such a
            turn's cost is unknown (``None``), never 0.
    """

    name = "scripted"

    def __init__(
        self,
        turns: list[dict[str, Any]],
        *,
        model: str = "scripted-1",
        context_window: int = 200_000,
        by_prompt: dict[str, list[dict[str, Any]]] | None = None,
        source: str = "scripted provider",
        pricing: Mapping[str, float] | None = None,
    ) -> None:
        """Check every turn (``turns`` and ``by_prompt``'s) against the file format.

        Raises:
            FormatError: a turn is not an object, a tool call lacks a string name or object
                arguments, or a field holds the wrong kind of value (``usage.input`` not a
                whole number...); the message names ``source``, the turn and the field.
        """
        numbered = [(f"turn {i + 1}", t) for i, t in enumerate(turns)] + [
            (f"by_prompt[{key!r}] turn {i + 1}", t)
            for key, ts in (by_prompt or {}).items()
            for i, t in enumerate(ts if isinstance(ts, list) else [ts])
        ]
        for where, turn in numbered:
            check_turn(turn, f"{source}: {where}")
        self.turns = turns
        self.by_prompt = by_prompt or {}
        self.model = model
        self.context_window = context_window
        self.pricing = dict(pricing) if pricing else None

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> ScriptedProvider:
        """Load a script file.

        Raises:
            FormatError: unreadable, not JSON, or without a ``turns`` list (names the file).
        """
        try:
            data = codec.loads(Path(path).read_bytes())
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot read scripted provider file {path}: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
            raise FormatError(f'scripted provider file {path} needs {{"turns": [...]}}')
        by_prompt = data.get("by_prompt") or {}
        if not isinstance(by_prompt, dict):
            raise FormatError(f"scripted provider file {path}: by_prompt must be an object")
        window = data.get("context_window")
        if window is not None:
            if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
                raise FormatError(
                    f"scripted provider file {path}: context_window must be a positive integer"
                )
            kwargs.setdefault("context_window", window)
        kwargs.setdefault("source", f"scripted provider file {path}")
        return cls(data["turns"], by_prompt=by_prompt, **kwargs)

    def _usage(self, turn: dict[str, Any]) -> dict[str, Any]:
        usage = empty_usage()
        given = turn.get("usage") or {}
        for k in ("input", "output", "cacheRead", "cacheWrite"):
            usage[k] = int(given.get(k, 0))
        usage["totalTokens"] = int(given.get("totalTokens", usage["input"] + usage["output"]))
        cost = given.get("cost")
        if not cost:  # no cost in the script: priced like a real provider, or unknown
            return priced(usage, self.pricing)
        parts = {k: float(cost.get(k, 0.0)) for k in PRICE_KEYS}
        usage["cost"] = {**parts, "total": float(cost.get("total", sum(parts.values())))}
        return usage

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Play turn ``request.turn`` (see the module docstring).

        Raises:
            ProviderError: retryable 503 for the turn's first ``fail_attempts`` attempts.
        """
        # a network provider suspends while its request is on the wire: so does this one,
        # once, so other sessions and lanes of the event loop run between turns as they do
        # with a real provider (design/host.md, "Many sessions in one process: measured")
        await anyio.lowlevel.checkpoint()
        if request.purpose != "turn":
            text = " / ".join(text_of(m.get("content"))[:80] for m in request.messages[-6:])
            summary = f"Summary of {len(request.messages)} messages: {text}"
            yield TextDelta(summary)
            yield Done(self._message([{"type": "text", "text": summary}], {}, "stop"))
            return
        turns = self.by_prompt.get(request.prompt, self.turns)
        turn = (
            turns[request.turn - 1] if request.turn <= len(turns) else {"text": "(script finished)"}
        )
        if request.attempt <= int(turn.get("fail_attempts", 0)):
            raise ProviderError(
                f"scripted failure of turn {request.turn} attempt {request.attempt}",
                retryable=True,
                status=503,
            )
        text = str(turn.get("text", ""))
        chunks = max(1, int(turn.get("chunks", 2)))
        delay = float(turn.get("delay", 0.0))
        step = max(1, -(-len(text) // chunks)) if text else 1
        content: list[dict[str, Any]] = []
        pieces = [text[i : i + step] for i in range(0, len(text), step)] or [""]
        gate = turn.get("wait_for")
        gate_at = min(1, len(pieces) - 1)  # after the first chunk, if there is a second
        for i, piece in enumerate(pieces):
            if delay:
                await anyio.sleep(delay)
            if i == gate_at and gate:
                while not Path(str(gate)).exists():
                    await anyio.sleep(0.02)
            if piece:
                yield TextDelta(piece)
        if text:
            content.append({"type": "text", "text": text})
        calls = turn.get("tool_calls") or []
        for i, call in enumerate(calls):
            cid = str(call.get("id") or f"call_{request.run_id[-4:]}_{request.turn}_{i + 1}")
            args = dict(call.get("arguments") or {})
            yield ToolCallEvent(cid, str(call["name"]), args)
            content.append(
                {"type": "toolCall", "id": cid, "name": str(call["name"]), "arguments": args}
            )
        stop = "toolUse" if calls else str(turn.get("stop_reason", "stop"))
        yield Done(self._message(content, turn, stop))

    def _message(
        self, content: list[dict[str, Any]], turn: dict[str, Any], stop: str
    ) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": content,
            "provider": self.name,
            "model": self.model,
            "usage": self._usage(turn),
            "stopReason": stop,
            "timestamp": now_ms(),
        }
