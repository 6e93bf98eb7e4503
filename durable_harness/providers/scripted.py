"""The scripted provider: deterministic answers from a JSON file, for tests, demos and the
crash matrix.

File format (design brief, section 4)::

    {"turns": [
        {"text": "I'll look.", "tool_calls": [{"name": "read_file", "arguments": {...}}],
         "usage": {"input": 100, "output": 20}, "fail_attempts": 0, "delay": 0.0,
         "chunks": 4}
    ]}

The k-th assistant message of a run gets turn k, so a restarted run continues where it was.
A file may also give ``"by_prompt": {"<prompt text>": [turns...]}``: a run whose prompt text
matches a key plays those turns instead (sessions with several runs or lanes).
Optional per-turn fields: ``fail_attempts`` (the first n attempts of that turn fail with a
retryable HTTP 503), ``delay`` (seconds to wait before each chunk: lets tests abort mid-stream),
``chunks`` (how many text deltas to stream), ``wait_for`` (a file path: after the first chunk,
or before the only one, the stream waits until that file exists, so a test holds a run open as
long as it needs instead of guessing a delay). Tool call ids are
``call_<last 4 of run id>_<turn>_<index>``: unique per run and the same across restarts. A run
that asks for a turn past the end gets a plain ``"(script finished)"`` answer. Compaction and
branch-summary requests get a summary built from the context's text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from durable_harness.errors import FormatError, ProviderError
from durable_harness.ids import now_ms
from durable_harness.models.messages import text_of
from durable_harness.providers.base import (
    Done,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ToolCallEvent,
    empty_usage,
)
from durable_harness.storage import codec


class ScriptedProvider:
    """A :class:`~durable_harness.providers.base.Provider` that plays a script.

    Args:
        turns: the ``turns`` list of the file format above.
        model: model id to record; ``context_window`` in tokens.
    """

    name = "scripted"

    def __init__(
        self,
        turns: list[dict[str, Any]],
        *,
        model: str = "scripted-1",
        context_window: int = 200_000,
        by_prompt: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        extra = [t for ts in (by_prompt or {}).values() for t in ts]
        for i, turn in enumerate([*turns, *extra]):
            if not isinstance(turn, dict):
                raise FormatError(f"scripted turn {i + 1} is not an object")
            for call in turn.get("tool_calls") or []:
                if not (
                    isinstance(call, dict)
                    and isinstance(call.get("name"), str)
                    and isinstance(call.get("arguments", {}), dict)
                ):
                    raise FormatError(
                        f"scripted turn {i + 1}: each tool call needs a string "
                        "name and an object of arguments"
                    )
        self.turns = turns
        self.by_prompt = by_prompt or {}
        self.model = model
        self.context_window = context_window

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
        return cls(data["turns"], by_prompt=by_prompt, **kwargs)

    def _usage(self, turn: dict[str, Any]) -> dict[str, Any]:
        usage = empty_usage()
        given = turn.get("usage") or {}
        for k in ("input", "output", "cacheRead", "cacheWrite"):
            usage[k] = int(given.get(k, 0))
        usage["totalTokens"] = int(given.get("totalTokens", usage["input"] + usage["output"]))
        cost = given.get("cost") or {}
        for k in ("input", "output", "cacheRead", "cacheWrite"):
            usage["cost"][k] = float(cost.get(k, 0.0))
        usage["cost"]["total"] = float(
            cost.get(
                "total",
                sum(usage["cost"][k] for k in ("input", "output", "cacheRead", "cacheWrite")),
            )
        )
        return usage

    async def stream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """Play turn ``request.turn`` (see the module docstring).

        Raises:
            ProviderError: retryable 503 for the turn's first ``fail_attempts`` attempts.
        """
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
