"""Fixtures for the MCP tests: the test server (``notes_server.py``, written with the SDK's
server API) as a config over stdio, and the same server over streamable HTTP on a free
loopback port (a real uvicorn, started and stopped by the fixture)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SERVER = Path(__file__).with_name("notes_server.py")


@pytest.fixture
def anyio_backend() -> str:
    """The MCP SDK's transports run on asyncio here (the harness's trio runs are tested
    elsewhere; the servers are child processes either way)."""
    return "asyncio"


def stdio_server(notes: Path, **extra: Any) -> dict[str, Any]:
    """The config entry of the notes server over stdio, appending to ``notes``."""
    return {
        "command": sys.executable,
        "args": [str(SERVER), "stdio"],
        "env": {"NOTES_FILE": str(notes)},
        **extra,
    }


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """The file the destructive ``append_line`` appends to (one line per effect)."""
    return tmp_path / "notes.txt"


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write ``{"mcpServers": servers}`` to a file; its path."""

    def write(servers: dict[str, Any]) -> Path:
        path = tmp_path / "mcp.json"
        path.write_text(json.dumps({"mcpServers": servers}))
        return path

    return write


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_notes(notes: Path) -> Iterator[str]:
    """The notes server over streamable HTTP: its ``/mcp`` URL once it accepts connections."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env={"NOTES_FILE": str(notes), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the MCP HTTP server did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)
