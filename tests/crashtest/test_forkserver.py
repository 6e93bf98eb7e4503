"""The crash matrix's warm fork server (``durable_harness/crashtest/forkserver.py``): its children
are real processes, SIGKILLed at the named crash point, with the requested env and folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_harness.crash import ENV_VAR, TRACE_VAR
from durable_harness.crashtest import forkserver
from durable_harness.crashtest.forkserver import ForkServer, ForkServerError
from durable_harness.crashtest.scenario import default_dir

from . import forkhelp

pytestmark = [
    pytest.mark.crash,
    pytest.mark.skipif(not forkserver.available(), reason="needs fork and pidfd_open (Linux)"),
]
SCENARIOS = default_dir()


def target(name: str) -> str:
    return f"{forkhelp.__name__}:{name}"


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, TRACE_VAR)}
    return env | extra


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    with ForkServer() as fs:
        yield fs


def wait_for(pred: object, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return status == "Z"  # exited, not yet reaped by whoever owns it


def test_env_cwd_stdin_and_output_are_the_requests(server: ForkServer, tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    env = base_env(FORK_TEST_VALUE="x1")
    env.pop("HOME", None)
    done = server.run([str(out)], env=env, cwd=str(tmp_path), timeout=60, target=target("report"))
    seen = json.loads(out.read_text())
    assert done.returncode == 3
    assert seen["env"] == env  # exactly the request's environment: HOME removed, value added
    assert seen["cwd"] == str(tmp_path)
    assert seen["stdin"] == ""  # /dev/null
    assert server.proc is not None and seen["ppid"] == server.proc.pid
    assert "to stdout" in done.output and "to stderr" in done.output
    assert done.pid != os.getpid()


def test_separate_streams_and_preload(server: ForkServer, tmp_path: Path) -> None:
    """``separate``: stdout and stderr come back apart (a CLI child's test reads them apart);
    ``preload``: the server imports the target's module before forking, and the child is still
    a process of its own with the request's folder."""
    out = tmp_path / "seen.json"
    done = server.run(
        [str(out)],
        env=base_env(),
        cwd=str(tmp_path),
        timeout=60,
        target=target("report"),
        separate=True,
        preload=True,
    )
    assert done.returncode == 3
    assert done.output == "to stdout\n" and done.stderr == "to stderr\n"
    seen = json.loads(out.read_text())
    assert seen["cwd"] == str(tmp_path) and done.pid != os.getpid()
    assert server.proc is not None and seen["ppid"] == server.proc.pid


def test_a_child_s_collector_skips_what_the_server_imported(
    server: ForkServer, tmp_path: Path
) -> None:
    """The server freezes what it imported before it forks (``gc.freeze``): a child's garbage
    collections then pass over the warm modules' objects instead of walking them, which cost
    the matrix a third of its CPU (the pages they write are copied for each child)."""
    out = tmp_path / "gc.json"
    done = server.run(
        [str(out)], env=base_env(), cwd=str(tmp_path), timeout=60, target=target("frozen")
    )
    assert done.returncode == 0, done.output
    seen = json.loads(out.read_text())
    assert seen["frozen"] > 20_000  # the warm modules: about 50,000 objects
    assert seen["tracked"] < seen["frozen"] // 4  # what the child made itself


def test_crash_point_is_rearmed_per_child(server: ForkServer, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    env = base_env(**{ENV_VAR: "after_tool_started:2", TRACE_VAR: str(trace)})
    args = ["after_tool_started", "3"]
    cwd = str(tmp_path)
    killed = server.run(args, env=env, cwd=cwd, timeout=60, target=target("hit"))
    assert killed.returncode == -signal.SIGKILL
    assert trace.read_text().split() == ["after_tool_started"] * 2  # killed at the second hit
    # the next child starts from the server's state, not the killed one's: no target, no trace
    clean = server.run(args, env=base_env(), cwd=cwd, timeout=60, target=target("hit"))
    assert clean.returncode == 0
    first = server.run(
        ["after_tool_started", "1"], env=env, cwd=cwd, timeout=60, target=target("hit")
    )
    assert first.returncode == 0  # one hit of a :2 target: the count restarted at zero


def test_matrix_child_is_sigkilled_at_the_point_and_its_store_stays(
    server: ForkServer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = [str(SCENARIOS / "single_tool.json"), f"sqlite:{tmp_path / 's.db'}", str(work)]
    args.append(str(tmp_path / "sid"))
    env = base_env(**{ENV_VAR: "after_tool_started"})
    done = server.run(args, env=env, cwd=os.getcwd(), timeout=60)
    assert done.returncode == -signal.SIGKILL, done.output
    from durable_harness.storage import open_store

    sid = (tmp_path / "sid").read_text()
    with open_store(f"sqlite:{tmp_path / 's.db'}").open_session(sid, write=False) as s:
        assert any(r.get("type") == "tool_started" for r in s.records())


def test_two_children_run_at_once(server: ForkServer, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    results: dict[str, int] = {}

    def run(me: str, other: str) -> None:
        done = server.run(
            [me, other], env=base_env(), cwd=str(tmp_path), timeout=60, target=target("rendezvous")
        )
        results[me] = done.returncode

    threads = [threading.Thread(target=run, args=p) for p in ((a, b), (b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {a: 0, b: 0}  # each waited for the other: they ran side by side


def test_a_traceback_is_exit_1_with_the_traceback(server: ForkServer, tmp_path: Path) -> None:
    done = server.run([], env=base_env(), cwd=str(tmp_path), timeout=60, target=target("boom"))
    assert done.returncode == 1
    assert "ValueError: boom from the forked child" in done.output


def test_a_hung_child_is_killed_at_the_timeout(server: ForkServer, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(
            [str(pidfile)], env=base_env(), cwd=str(tmp_path), timeout=0.5, target=target("hang")
        )
    pid = int(pidfile.read_text())
    wait_for(lambda: gone(pid), f"the hung child {pid} to be killed")
    # the server still serves
    done = server.run([], env=base_env(), cwd=str(tmp_path), timeout=60, target=target("boom"))
    assert done.returncode == 1


def test_the_server_dying_is_a_clear_error(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    fs = ForkServer()
    fs.start()
    assert fs.proc is not None
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fs.run(
                [str(pidfile)],
                env=base_env(),
                cwd=str(tmp_path),
                timeout=600,
                target=target("hang"),
            )
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    wait_for(pidfile.exists, "the child's pid file")
    child = int(pidfile.read_text())
    os.kill(fs.proc.pid, signal.SIGKILL)
    t.join(timeout=60)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ForkServerError), errors
    assert "fork server" in str(errors[0]) and str(fs.proc.pid) in str(errors[0])
    assert "-9" in str(errors[0])
    wait_for(lambda: gone(child), f"the orphaned child {child} to be killed")
    with pytest.raises(ForkServerError, match="fork server"):
        fs.run([], env=base_env(), cwd=str(tmp_path), timeout=60, target=target("boom"))
    fs.stop()


def test_fork_env_zero_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.FORK_ENV, "0")
    assert not forkserver.enabled()
    monkeypatch.setenv(forkserver.FORK_ENV, "1")
    assert forkserver.enabled()


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_cell_forks_its_children_unless_fork_is_0(
    fork: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_harness.crashtest.runner import Cell, baseline, run_cell
    from durable_harness.crashtest.scenario import load

    calls: list[list[str]] = []
    real = ForkServer.run

    def counted(self: ForkServer, argv: list[str], **kw: Any) -> forkserver.Completed:
        calls.append(argv)
        return real(self, argv, **kw)

    monkeypatch.setattr(ForkServer, "run", counted)
    monkeypatch.setenv(forkserver.FORK_ENV, fork)
    sc = load(str(SCENARIOS / "single_tool.json"))
    base = baseline(sc, "jsonl")
    cell = run_cell(sc, base, Cell(sc.name, "jsonl", "after_tool_started", 1))
    assert cell.status == "pass", cell.failures
    # baseline, crashing child, --continue child: all forked, or none
    assert len(calls) == (3 if fork == "1" else 0)
    assert fork == "0" or "--continue" in calls[-1]


def test_run_cli_without_the_server_starts_a_fresh_interpreter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where the server cannot run, ``run_cli`` still runs the CLI, as a process of its own."""
    monkeypatch.setattr(forkserver, "available", lambda: False)
    monkeypatch.setattr(forkserver, "shared", lambda: pytest.fail("the server was used"))
    done = forkserver.run_cli(["crash-points"], env=dict(os.environ), cwd=str(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "after_tool_started" in done.stdout


def test_a_spawned_child_runs_on_and_is_signalled_and_reaped_like_popen(
    server: ForkServer, tmp_path: Path
) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    child = server.spawn(
        [str(tmp_path / "started")], env=base_env(), cwd=str(tmp_path), stdout=str(out),
        stderr=str(err), timeout=60, target=target("hang"),
    )  # fmt: skip
    wait_for(lambda: (tmp_path / "started").exists(), "the spawned child to start")
    assert child.poll() is None and child.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.1)
    child.terminate()
    assert child.wait(timeout=30) == -signal.SIGTERM == child.returncode
    assert gone(child.pid)
    child.kill()  # after its end: nothing is sent (the pid may be another process's by now)
    assert child.poll() == -signal.SIGTERM


def test_a_spawned_child_talks_through_pipes_and_sees_end_of_input(
    server: ForkServer, tmp_path: Path
) -> None:
    """``stdin``/``stdout`` as ``PIPE``: the child reads what is written, answers on its stdout,
    sees the end of its input when our end closes (no other copy of the pipe is left open, in
    the server or here), and keeps no descriptor beyond its three."""
    err = tmp_path / "err"
    child = server.spawn(
        [], env=base_env(), cwd=str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=str(err), timeout=60, target=target("echo"),
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(b"hello\n")
    child.stdin.flush()
    assert child.stdout.readline() == b"HELLO\n"
    child.stdin.write(b"again\n")
    child.stdin.close()
    assert child.stdout.read() == b"AGAIN\n"  # then end of file: the child's stdout closed
    assert child.wait(timeout=30) == 4
    child.stdout.close()
    fds = json.loads(err.read_text())
    assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds  # the fourth: listdir's own


def test_a_spawned_child_writes_to_a_passed_descriptor(server: ForkServer, tmp_path: Path) -> None:
    """``stdout`` as an open descriptor: the child writes to that file (``acp > file``)."""
    out = tmp_path / "out"
    with out.open("wb") as f:
        child = server.spawn(
            [], env=base_env(), cwd=str(tmp_path), stdin=subprocess.PIPE, stdout=f.fileno(),
            stderr=str(tmp_path / "err"), timeout=60, target=target("echo"),
        )  # fmt: skip
    assert child.stdin is not None and child.stdout is None
    child.stdin.write(b"to a file\n")
    child.stdin.close()
    assert child.wait(timeout=30) == 4
    assert out.read_bytes() == b"TO A FILE\n"


def test_a_spawned_child_is_polled_from_one_thread_while_another_waits(
    server: ForkServer, tmp_path: Path
) -> None:
    """As with ``Popen``: a thread polling while another waits gets ``None`` or the exit code,
    never an error, and both end with the same code."""
    child = server.spawn(
        [], env=base_env(), cwd=str(tmp_path), stdin=subprocess.PIPE, stdout=str(tmp_path / "o"),
        stderr=str(tmp_path / "e"), timeout=60, target=target("echo"),
    )  # fmt: skip
    assert child.stdin is not None
    seen: list[int | None] = []
    errors: list[BaseException] = []

    def poller() -> None:
        try:
            while not seen or seen[-1] is None:
                seen.append(child.poll())
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=poller)
    thread.start()
    time.sleep(0.05)
    child.stdin.close()  # the child reads to the end of its input and exits 4
    assert child.wait(timeout=30) == 4
    thread.join(timeout=30)
    assert not errors and seen[-1] == 4 == child.returncode
