"""Fixtures of the HTTP API tests: servers started per test (and stopped after it),
scripted-provider files, a working directory."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .util import Server


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``start_server(store=None, *args, env=..., token=...)``: start a server (default store:
    ``jsonl:<tmp>/store``); every one started is stopped after the test."""
    servers: list[Server] = []

    def start(store: str | None = None, *args: str, **kw: Any) -> Server:
        server = Server(store or f"jsonl:{tmp_path / 'store'}", *args, home=tmp_path / "home", **kw)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    for server in servers:  # no request of any test may have hit an internal error
        log = server.stderr()
        assert "Traceback" not in log and "internal error" not in log, log[-4000:]


@pytest.fixture
def script(tmp_path: Path) -> Callable[..., str]:
    """``script(turns, **extra) -> "scripted:PATH"``: write a scripted-provider file."""
    count = itertools.count()

    def write(turns: list[dict[str, Any]], **extra: Any) -> str:
        path = tmp_path / f"script-{next(count)}.json"
        path.write_text(json.dumps({"turns": turns, **extra}))
        return f"scripted:{path}"

    return write


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working directory for sessions."""
    path = tmp_path / "work"
    path.mkdir()
    return path
