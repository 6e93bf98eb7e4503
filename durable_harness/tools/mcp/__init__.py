"""MCP tools (``design/mcp.md``): servers named in an ``{"mcpServers": {...}}`` config, reached
through the official ``mcp`` SDK over stdio or streamable HTTP, each of their tools a
durable-harness tool whose replay class comes from its annotations (or the config's override).

:func:`load_mcp_config` / :func:`parse_mcp_config` read a config, :class:`McpServers` holds the
connections (an async context manager) and gives the tools.
"""

from durable_harness.tools.mcp.client import CONNECT_TIMEOUT, McpServers
from durable_harness.tools.mcp.config import McpConfig, load_mcp_config, parse_mcp_config
from durable_harness.tools.mcp.tool import McpTool, map_result, replay_of, tool_name

__all__ = [
    "CONNECT_TIMEOUT",
    "McpConfig",
    "McpServers",
    "McpTool",
    "load_mcp_config",
    "map_result",
    "parse_mcp_config",
    "replay_of",
    "tool_name",
]
