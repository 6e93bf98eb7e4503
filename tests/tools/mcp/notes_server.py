"""An MCP server written with the SDK's server API, for the MCP tests: a read-only tool
(``peek``), an idempotent one (``put``), a destructive one (``append_line``, which appends to
``$NOTES_FILE`` so a second run is visible), one without annotations (``shrug``) and one that
returns an image, structured content and ``isError`` (``picture``, ``fail``).

``python notes_server.py stdio`` or ``python notes_server.py http PORT``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from notes_png import PNG_1X1  # beside this file (a script's folder is first on sys.path)

server = MCPServer("notes", version="1.2.3")


def notes() -> Path:
    return Path(os.environ["NOTES_FILE"])


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def peek() -> str:
    """Read the notes file."""
    return notes().read_text() if notes().exists() else ""


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True))
def put(key: str, value: str) -> dict[str, str]:
    """Set a key (same arguments, same state)."""
    (notes().parent / f"{key}.value").write_text(value)
    return {"key": key, "value": value}


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def append_line(line: str) -> str:
    """Append a line to the notes file (each call adds one)."""
    with notes().open("a") as fh:
        fh.write(line + "\n")
    return f"appended {line}"


@server.tool()
def shrug() -> str:
    """A tool with no annotations."""
    return "shrug"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def picture() -> CallToolResult:
    """An image with a caption and structured content."""
    return CallToolResult(
        content=[
            TextContent(text="a dot"),
            ImageContent(data=PNG_1X1, mime_type="image/png"),
        ],
        structured_content={"width": 1, "height": 1},
    )


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def fail() -> CallToolResult:
    """A tool error (``isError``)."""
    return CallToolResult(content=[TextContent(text="it broke")], is_error=True)


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
