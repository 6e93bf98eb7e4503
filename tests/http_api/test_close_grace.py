"""``serve --close-grace``: the HTTP close route runs the staged close with the server's grace
(a real server, a real bash process group that traps SIGTERM)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from durable_harness.tools.processes import group_alive

from .test_api import create, send
from .util import run_records, wait_state


def _appears(path: Path, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() or not path.read_text().strip():  # written, not only created
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


@pytest.mark.slow
def test_close_route_terms_at_once_and_kills_at_the_servers_grace(start_server, script, workdir):
    command = (
        f"echo $$ > {workdir / 'pid'}; trap 'date +%s.%N > {workdir / 'term'}' TERM; "
        "while :; do sleep 0.05; done"
    )
    call = {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}
    provider = script([call, {"text": "never"}])
    grace = 2.0
    server = start_server(None, "--close-grace", str(grace))
    with server.client() as c:
        sid = create(c, workdir, provider)["id"]
        assert send(c, sid, "go").status_code == 202
        _appears(workdir / "pid")
        pgid = int((workdir / "pid").read_text())
        wall, started = time.time(), time.monotonic()
        closed = c.post(
            f"/sessions/{sid}/close",
            content="{}",
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        took = time.monotonic() - started
        assert closed.status_code == 200 and closed.json()["state"] == "closed", closed.text
        assert not group_alive(pgid)
        term_at = float((workdir / "term").read_text()) - wall
        assert term_at < 1.0, f"SIGTERM came {term_at:.2f} s into the grace"
        assert grace - 0.2 <= took <= grace + 2.0, f"close took {took:.2f} s"  # SIGKILL at end
        wait_state(c, sid, "closed")
        outcomes = [r["outcome"] for r in run_records(c, sid, "run_finished")]
        assert outcomes == ["aborted"]


def test_the_close_grace_defaults_to_five_seconds() -> None:
    from durable_harness.cli.main import build_parser
    from durable_harness.host import HostOptions

    assert HostOptions().close_grace == 5.0
    args = build_parser().parse_args(["serve"])
    assert args.close_grace is None  # not given: HostOptions' default, written once, applies
    assert build_parser().parse_args(["serve", "--close-grace", "2.5"]).close_grace == 2.5


@pytest.mark.slow
def test_serve_pty_size_is_the_window_a_pty_session_sees(start_server, script, workdir):
    """``serve --pty-size``: the pty runtime's window size is a host setting (default 24x80,
    ``tests/tools/test_bash_pty.py``), seen by the command as its terminal's size."""
    command = f"stty size > {workdir / 'size'}"
    call = {"text": "", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]}
    provider = script([call, {"text": "done"}])
    server = start_server(None, "--pty-size", "30x100")
    with server.client() as c:
        made = c.post(
            "/sessions",
            json={"cwd": str(workdir), "provider": provider, "command_runtime": "pty"},
        )
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert send(c, sid, "go").status_code == 202
        _appears(workdir / "size")
        wait_state(c, sid, "idle")
    assert (workdir / "size").read_text().split() == ["30", "100"]
