"""durable-harness as an Agent Client Protocol agent over stdio (``design/acp.md``):
:func:`serve`, which ``durable-harness acp`` calls."""

from __future__ import annotations

import logging
from typing import cast

import anyio
from acp.agent.connection import AgentSideConnection
from acp.interfaces import Agent

from durable_harness.acp.agent import DurableAgent, acp_options
from durable_harness.acp.transport import stdio_transport
from durable_harness.host.manager import SessionManager
from durable_harness.host.options import HostOptions
from durable_harness.storage.base import Store

__all__ = ["ANSWER_WAIT_S", "DurableAgent", "serve"]

log = logging.getLogger(__name__)

ANSWER_WAIT_S = 10.0
"""How long the agent, its sessions closed, waits for its open requests' answers (seconds)."""


async def serve(store: Store | str | None, options: HostOptions) -> None:
    """Serve ACP on stdin/stdout over ``store`` (or its spec) with ``options`` (made
    :func:`~durable_harness.acp.agent.acp_options`) until the client goes away; then close the
    sessions this agent ran and answer what is open (``design/acp.md``, "Lifetime")."""
    agent = DurableAgent()
    transport, supervisor = await stdio_transport()
    agent.output_open = lambda: not transport.output_lost
    async with (
        SessionManager(store, acp_options(options, agent)) as manager,
        anyio.create_task_group() as tg,
    ):
        agent.bind(manager, tg)
        # the SDK routes a method the agent does not define to "method not found"
        conn = AgentSideConnection(cast(Agent, agent), transport, listening=False)
        try:
            await conn.listen()
        finally:
            with anyio.CancelScope(shield=True):
                gone = "closed stdout" if transport.output_lost else "closed stdin"
                await agent.close_all(f"the client {gone}")
                if not await transport.answered(ANSWER_WAIT_S):
                    log.warning("some requests were not answered within %s s", ANSWER_WAIT_S)
                await conn.close()
                await supervisor.shutdown()
            tg.cancel_scope.cancel()
