"""Newline-delimited JSON-RPC over stdio that answers malformed input (``design/acp.md``).

The SDK's stdio transport drops a line it cannot parse without a word, and a line that parses
to something other than a message object would stop its receive loop. This transport checks
each line before the connection sees it and answers, as JSON-RPC 2.0 says:

- a line that is not JSON: ``-32700`` (parse error), ``id: null``;
- JSON that is not a request, notification or response (an array, a number, an object with
  neither ``method`` nor ``id``, a non-string ``method``, an ``id`` that is not a string,
  number or null): ``-32600`` (invalid request), with the message's ``id`` when it has a
  usable one.

The process lives on either way; only well-formed messages reach the agent.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from acp._transport import NdjsonTransport
from acp.task import MessageSender, TaskSupervisor

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def check_message(message: Any) -> tuple[str, Any] | None:
    """Why ``message`` (parsed JSON) is not a JSON-RPC message, as ``(reason, id to answer
    with)``; ``None`` when it is one."""
    if not isinstance(message, dict):
        if isinstance(message, list):
            return "the message is an array (batches are not supported)", None
        return "the message is not a JSON object", None
    mid = message.get("id")
    usable_id = mid if isinstance(mid, (str, int)) and not isinstance(mid, bool) else None
    if "id" in message and mid is not None and usable_id is None:
        return "the message id must be a string, a number or null", None
    if "method" in message:
        if not isinstance(message["method"], str):
            return "the method must be a string", usable_id
        params = message.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            return "params must be an object or an array", usable_id
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None
    return "the message has no method and is not a response", usable_id


class CheckedNdjsonTransport(NdjsonTransport):
    """:class:`acp._transport.NdjsonTransport` that answers malformed lines with JSON-RPC
    errors (see the module docstring) instead of dropping them."""

    async def receive(self) -> dict[str, Any] | None:
        """The next well-formed message, or ``None`` at end of input."""
        while True:
            line = await self._read_line()
            if not line:
                return None
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                await self._refuse(PARSE_ERROR, "Parse error", f"not JSON: {exc}", None)
                continue
            problem = check_message(message)
            if problem is None:
                assert isinstance(message, dict)
                return message
            await self._refuse(INVALID_REQUEST, "Invalid request", *problem)

    async def _refuse(self, code: int, message: str, details: str, mid: Any) -> None:
        log.warning("refused a malformed JSON-RPC message: %s", details)
        error = {"code": code, "message": f"{message}: {details}", "data": {"details": details}}
        await self.send({"jsonrpc": "2.0", "id": mid, "error": error})


async def stdio_transport() -> tuple[CheckedNdjsonTransport, TaskSupervisor]:
    """The checked transport over this process's stdin and stdout, and the supervisor of its
    writer task (shut it down when done)."""
    from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES
    from acp.stdio import stdio_streams

    reader, writer = await stdio_streams(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    supervisor = TaskSupervisor(source="durable_harness.acp.transport")
    return CheckedNdjsonTransport(reader, MessageSender(writer, supervisor)), supervisor


__all__ = ["CheckedNdjsonTransport", "check_message", "stdio_transport"]
