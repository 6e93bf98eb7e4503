"""Helpers of the console tests: a FastAPI app that mounts the console over a SessionManager
on a real store, a real uvicorn server for it on a free loopback port, and a real crash (a
``durable-harness run`` child that SIGKILLs itself at a crash point)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from durable_harness.console import console_router
from durable_harness.crashtest import forkserver
from durable_harness.host import HostOptions, SessionManager
from durable_harness.storage import open_store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def script(tmp_path: Path, turns: list[dict[str, Any]], name: str = "script.json") -> str:
    """Write a scripted provider file; return its provider spec."""
    path = tmp_path / name
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def workdir(tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return str(work)


def cli_run(
    tmp_path: Path, spec: str, provider: str, prompt: str = "go", point: str | None = None
) -> str:
    """Run ``durable-harness run`` in a child (forked from the warm fork server,
    ``forkserver.run_cli``: a process of its own that a crash point SIGKILLs), to its end or
    (``point``) until it SIGKILLs itself there; return the id of the session it left."""
    before = {i.id for i in open_store(spec).list_sessions()}
    env = {**os.environ, "DURABLE_HARNESS_CRASH_AT": point} if point else dict(os.environ)
    argv = ["run", prompt, "--store", spec, "--provider", provider, "--cwd", workdir(tmp_path)]
    proc = forkserver.run_cli([*argv, "--quiet"], env=env, cwd=os.getcwd(), timeout=60)
    assert proc.returncode == (-9 if point else 0), proc.stderr
    (new,) = [i.id for i in open_store(spec).list_sessions() if i.id not in before]
    return new


def crashed_cli_run(
    tmp_path: Path, spec: str, provider: str, point: str, prompt: str = "go"
) -> str:
    """Run ``durable-harness run`` in a child that SIGKILLs itself at ``point``; return the
    id of the session it left."""
    return cli_run(tmp_path, spec, provider, prompt, point)


def console_app(spec: str, options: HostOptions, token: str | None = None) -> FastAPI:
    """An app whose lifespan enters a SessionManager on ``spec`` and that mounts the console
    (as the host's HTTP app does)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with SessionManager(spec, options) as manager:
            app.state.manager = manager
            yield

    app = FastAPI(lifespan=lifespan)
    app.include_router(console_router(lambda: app.state.manager, token=token))
    return app


@contextmanager
def served(app: FastAPI, limit: float = 30.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port (bound at port 0) in a thread;
    yield its base URL; stop it on exit. A server in a thread has no signal handlers, so the
    event streams do not see it stop: close the pages that hold one (navigate away) first;
    streams still open are cut after ``timeout_graceful_shutdown``."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + limit
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the console server did not start")
        time.sleep(0.02)
    (sock,) = [s for srv in server.servers for s in srv.sockets][:1]
    port = sock.getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(limit)
        assert not thread.is_alive(), "the console server did not stop"


def snapshot_store(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (what "nothing changed on
    disk" compares)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
