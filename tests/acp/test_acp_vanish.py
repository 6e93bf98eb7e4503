"""ACP clients that vanish (issue 20, ``design/acp.md`` "Lifetime"): a real ``durable-harness
acp`` child whose client closes stdin, stops reading stdout, or both, mid-tool or while a
``session/new`` is being handled; and ``acp > file``. The pipes are driven by hand (the SDK's
client cannot close one of them alone)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from acp_helpers import script, start_agent, workdir

from durable_harness.recovery.fsck import fsck_session
from durable_harness.storage import open_store

pytestmark = [pytest.mark.timeout(120)]

EXIT_LIMIT_S = 30.0
"""How long the agent may take to exit once its client is gone (its close grace is 5 s)."""


def wait_until(check: Callable[[], Any], what: str, limit: float = 30.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Child:
    """``durable-harness acp`` with its stdin a pipe, its stdout a pipe (read by a thread
    into :attr:`lines`) or a file, and its stderr a file."""

    def __init__(self, tmp_path: Path, provider: str, stdout: IO[bytes] | None = None) -> None:
        self.store = f"jsonl:{tmp_path / 'store'}"
        self.err = tmp_path / "agent.log"
        argv = ["acp", "--store", self.store, "--provider", provider]
        env = {k: v for k, v in os.environ.items() if k != "DURABLE_HARNESS_CRASH_AT"}
        out = stdout.fileno() if stdout is not None else subprocess.PIPE
        self.proc = start_agent(argv, env=env, cwd=str(tmp_path), stderr=str(self.err), stdout=out)
        self.lines: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        if stdout is None:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _read(self) -> None:
        """Collect stdout's lines until EOF or :meth:`close_stdout` (a read blocked in
        another thread would keep the pipe's read end open: poll instead)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                return
            buf += data
            *whole, buf = buf.split(b"\n")
            self.lines.extend(json.loads(line) for line in whole if line.strip())

    def send(self, mid: int | None, method: str, params: dict[str, Any]) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if mid is not None:
            msg["id"] = mid
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self, mid: int) -> dict[str, Any]:
        return wait_until(  # type: ignore[no-any-return]
            lambda: next((m for m in self.lines if m.get("id") == mid and "method" not in m), None),
            f"the answer to request {mid}",
        )

    def start(self, cwd: str) -> str:
        """initialize, then session/new; the new session's id."""
        self.send(0, "initialize", {"protocolVersion": 1})
        self.answer(0)
        self.send(1, "session/new", {"cwd": cwd, "mcpServers": []})
        return str(self.answer(1)["result"]["sessionId"])

    def allow_tools(self) -> None:
        """Answer every permission request ``allow_once`` (in a thread)."""

        def loop() -> None:
            seen: set[Any] = set()
            while self.proc.poll() is None:
                for m in list(self.lines):
                    if m.get("method") == "session/request_permission" and m["id"] not in seen:
                        seen.add(m["id"])
                        result = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
                        msg = {"jsonrpc": "2.0", "id": m["id"], "result": result}
                        try:
                            assert self.proc.stdin is not None
                            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
                            self.proc.stdin.flush()
                        except (OSError, ValueError):
                            return
                time.sleep(0.02)

        threading.Thread(target=loop, daemon=True).start()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def stop_reading(self) -> None:
        """Stop the reader thread (stdout stays open, unread)."""
        assert self._reader is not None
        self._stop.set()
        self._reader.join()

    def close_stdout(self) -> None:
        """Close the read end of stdout: the agent's writes now fail."""
        assert self.proc.stdout is not None
        self.stop_reading()
        self.proc.stdout.close()

    def exit_code(self) -> int:
        started = time.monotonic()
        code = self.proc.wait(timeout=EXIT_LIMIT_S)
        self.exit_seconds = time.monotonic() - started
        return code

    def log(self) -> str:
        return self.err.read_text()


def slow_bash(tmp_path: Path) -> tuple[str, Path]:
    """A provider whose first turn runs a bash that marks it started, then sleeps 60 s."""
    started = tmp_path / "started"
    turns = [
        {
            "text": "Running it.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": f"touch {started}; sleep 60"}}
            ],
        },
        {"text": "Finished."},
    ]
    return script(tmp_path, turns), started


def closed_cleanly(store_spec: str, sid: str) -> dict[str, Any]:
    """Check the session left behind: closed, fsck clean, its run (if any) settled."""
    store = open_store(store_spec)
    assert fsck_session(sid, store)["ok"]
    with store.open_session(sid, write=False) as s:
        states = [r["state"] for r in s.records("main", types=("session_lifecycle",))]
        finished = s.records("main", types=("run_finished",))
        started = s.records("main", types=("run_started",))
    assert states[-1] == "closed", states
    return {"finished": finished, "started": started}


@pytest.mark.slow
@pytest.mark.parametrize("pipes", ["stdin", "stdout", "both"])
def test_a_client_gone_mid_tool_leaves_the_run_aborted_and_the_agent_exits_0(
    tmp_path: Path, pipes: str
) -> None:
    provider, started = slow_bash(tmp_path)
    child = Child(tmp_path, provider)
    sid = child.start(str(workdir(tmp_path)))
    child.allow_tools()
    child.send(2, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})
    wait_until(started.exists, "the bash to start")
    if pipes == "both":
        child.stop_reading()  # so that both ends close a few microseconds apart
    if pipes in ("stdin", "both"):
        child.close_stdin()
    if pipes in ("stdout", "both"):
        child.close_stdout()
    assert child.exit_code() == 0, child.log()
    assert child.exit_seconds < EXIT_LIMIT_S
    log = child.log()
    assert "Traceback" not in log and "error[" not in log, log
    assert f"the client closed {pipes if pipes != 'both' else 'stdout'}" in log
    if pipes == "stdin":  # stdout still open: the prompt was answered, as cancelled
        assert child.answer(2)["result"]["stopReason"] == "cancelled"
    elif pipes == "stdout":  # noticed at once: the answer is known to be undeliverable
        assert "the answer to request 2 cannot be sent" in log
    else:  # either end may be noticed first; the answer never reaches the client
        assert "closing 1 session(s)" in log
        assert not [m for m in child.lines if m.get("id") == 2]
    # the run stopped cleanly: aborted by the close, the session closed, the log consistent
    left = closed_cleanly(child.store, sid)
    (finished,) = left["finished"]
    assert finished["outcome"] == "aborted"
    assert len(left["started"]) == 1


@pytest.mark.slow
def test_stdin_closed_during_session_new_still_answers_it(tmp_path: Path) -> None:
    child = Child(tmp_path, script(tmp_path, [{"text": "hi"}]))
    child.send(0, "initialize", {"protocolVersion": 1})
    child.answer(0)
    # the request and the end of input arrive together: the create is under way at EOF
    child.send(1, "session/new", {"cwd": str(workdir(tmp_path)), "mcpServers": []})
    child.close_stdin()
    assert child.exit_code() == 0, child.log()
    sid = child.answer(1)["result"]["sessionId"]
    (info,) = open_store(child.store).list_sessions()
    assert info.id == sid
    assert closed_cleanly(child.store, sid)["started"] == []
    assert "the client closed stdin: closing 1 session(s)" in child.log()


@pytest.mark.slow
def test_both_pipes_closed_during_session_new_leave_no_session_unexplained(
    tmp_path: Path,
) -> None:
    """The request, then both pipes closed at once: however the agent's reads and writes
    interleave, a session it created is closed and, if the client could not be told, a log
    line names it."""
    child = Child(tmp_path, script(tmp_path, [{"text": "hi"}]))
    child.send(0, "initialize", {"protocolVersion": 1})
    child.answer(0)
    child.stop_reading()
    child.send(1, "session/new", {"cwd": str(workdir(tmp_path)), "mcpServers": []})
    child.close_stdin()
    child.close_stdout()
    assert child.exit_code() == 0, child.log()
    log = child.log()
    assert "Traceback" not in log, log
    told = [m["result"]["sessionId"] for m in child.lines if m.get("id") == 1]
    for info in open_store(child.store).list_sessions():
        closed_cleanly(child.store, info.id)
        assert info.id in told or info.id in log, log


@pytest.mark.slow
def test_stdout_a_regular_file(tmp_path: Path) -> None:
    """``durable-harness acp > file``: the answers land in the file, one per line."""
    out = tmp_path / "out.jsonl"
    with out.open("wb") as f:
        child = Child(tmp_path, script(tmp_path, [{"text": "hello from a file"}]), stdout=f)

    def answers() -> dict[Any, dict[str, Any]]:
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        return {m["id"]: m for m in lines if "id" in m and "method" not in m}

    child.send(0, "initialize", {"protocolVersion": 1})
    wait_until(lambda: 0 in answers(), "initialize's answer in the file")
    child.send(1, "session/new", {"cwd": str(workdir(tmp_path)), "mcpServers": []})
    sid = wait_until(lambda: answers().get(1), "session/new's answer")["result"]["sessionId"]
    child.send(2, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
    done = wait_until(lambda: answers().get(2), "the prompt's answer")
    assert done["result"]["stopReason"] == "end_turn"
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    chunks = [
        m["params"]["update"]["content"]["text"]
        for m in lines
        if m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    assert "".join(chunks) == "hello from a file"
    child.close_stdin()
    assert child.exit_code() == 0, child.log()
    closed_cleanly(child.store, sid)


@pytest.mark.slow
def test_stdin_closed_while_the_provider_streams(tmp_path: Path) -> None:
    """Mid-prompt, no tool yet: the provider is held at its turn when stdin closes."""
    gate = tmp_path / "never"
    child = Child(tmp_path, script(tmp_path, [{"text": "slow", "wait_for": str(gate)}]))
    sid = child.start(str(workdir(tmp_path)))
    child.send(2, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]})

    def asked() -> bool:
        with open_store(child.store).open_session(sid, write=False) as s:
            return bool(s.records("main", types=("provider_request_started",)))

    wait_until(asked, "the provider request")
    child.close_stdin()
    assert child.exit_code() == 0, child.log()
    assert child.answer(2)["result"]["stopReason"] == "cancelled"
    (finished,) = closed_cleanly(child.store, sid)["finished"]
    assert finished["outcome"] == "aborted"
