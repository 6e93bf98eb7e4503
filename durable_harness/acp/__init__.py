"""durable-harness as an Agent Client Protocol agent over stdio (``design/acp.md``).

:func:`serve` runs :class:`~durable_harness.acp.agent.DurableAgent` on this process's stdin
and stdout, over a :class:`~durable_harness.host.SessionManager` of one store; the command
``durable-harness acp`` calls it.
"""

from __future__ import annotations

from typing import cast

import anyio
from acp.agent.connection import AgentSideConnection
from acp.interfaces import Agent

from durable_harness.acp.agent import DurableAgent, acp_options
from durable_harness.acp.transport import stdio_transport
from durable_harness.host.manager import SessionManager
from durable_harness.host.options import HostOptions
from durable_harness.storage.base import Store

__all__ = ["DurableAgent", "serve"]


async def serve(store: Store | str | None, options: HostOptions) -> None:
    """Serve ACP on stdin/stdout until the client closes stdin; then close the sessions
    this agent ran (running turns are aborted) and return.

    Args:
        store: the store (or spec) of the sessions.
        options: the host options (provider, policy...); tools are wrapped for ACP and no
            session is resumed at start-up (:func:`~durable_harness.acp.agent.acp_options`).
    """
    agent = DurableAgent()
    transport, supervisor = await stdio_transport()
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
                await agent.close_all()
                await conn.close()
                await supervisor.shutdown()
            tg.cancel_scope.cancel()
