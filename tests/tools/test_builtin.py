"""Tests of the built-in tools (read/write/edit/append files, bash)."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from durable_harness.errors import ToolError
from durable_harness.tools.base import Tool, ToolContext, ToolResult
from durable_harness.tools.builtin import (
    OUTPUT_CAP_BYTES,
    AppendFileTool,
    BashTool,
    EditFileTool,
    ReadFileTool,
    WriteFileTool,
    builtin_tools,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    """A context whose cwd is ``tmp_path/work``; ``tmp_path`` itself counts as outside."""
    work = tmp_path / "work"
    work.mkdir()
    return ToolContext(
        cwd=work,
        run_id="run-1",
        tool_call_id="call-1",
        idempotency_key="run-1:call-1",
        env={"EXTRA_VAR": "extra"},
    )


async def call(tool: Tool, ctx: ToolContext, **arguments: Any) -> ToolResult:
    """Validate ``arguments`` and execute ``tool``."""
    return await tool.execute(tool.parse_args(arguments), ctx)


async def reconcile(tool: Tool, ctx: ToolContext, **arguments: Any) -> ToolResult | None:
    """Validate ``arguments`` and reconcile ``tool``."""
    return await tool.reconcile(tool.parse_args(arguments), ctx)


def text_of(result: ToolResult) -> str:
    """The text of a one-block result."""
    assert len(result.content) == 1
    assert result.content[0]["type"] == "text"
    return str(result.content[0]["text"])


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer exists or is a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def group_gone(pgid: int) -> bool:
    """True when no live (non-zombie) process belongs to process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


# A tool that must not wait for a child's ``sleep 300`` has this long to return: far above what
# it needs on a loaded machine (milliseconds to a second or two), far below the sleep.
PROMPTLY = 30.0


def wait_until(predicate: Any, seconds: float = PROMPTLY) -> bool:
    """Poll ``predicate`` for up to ``seconds``; return its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


# ------------------------------------------------------------------------------------ read


async def test_read_whole_file(ctx: ToolContext) -> None:
    (ctx.cwd / "a.txt").write_text("one\ntwo\nthree\n")
    result = await call(ReadFileTool(), ctx, path="a.txt")
    assert not result.is_error
    assert text_of(result) == "one\ntwo\nthree\n"
    assert result.details is not None
    assert result.details["total_lines"] == 3
    assert result.details["truncated"] is False


async def test_read_offset_and_limit(ctx: ToolContext) -> None:
    (ctx.cwd / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = await call(ReadFileTool(), ctx, path="a.txt", offset=3, limit=2)
    assert text_of(result) == "line 3\nline 4\n"
    result = await call(ReadFileTool(), ctx, path="a.txt", offset=10)
    assert text_of(result) == "line 10\n"


async def test_read_offset_past_end_is_error(ctx: ToolContext) -> None:
    (ctx.cwd / "a.txt").write_text("one\n")
    result = await call(ReadFileTool(), ctx, path="a.txt", offset=5)
    assert result.is_error
    assert "past the end" in text_of(result)


async def test_read_absolute_path_inside(ctx: ToolContext) -> None:
    (ctx.cwd / "sub").mkdir()
    (ctx.cwd / "sub" / "b.txt").write_text("hi")
    result = await call(ReadFileTool(), ctx, path=str(ctx.cwd / "sub" / "b.txt"))
    assert text_of(result) == "hi"


async def test_read_missing_file_is_error(ctx: ToolContext) -> None:
    result = await call(ReadFileTool(), ctx, path="nope.txt")
    assert result.is_error
    assert "nope.txt" in text_of(result)
    assert "not found" in text_of(result)


async def test_read_directory_is_error(ctx: ToolContext) -> None:
    (ctx.cwd / "d").mkdir()
    result = await call(ReadFileTool(), ctx, path="d")
    assert result.is_error
    assert "directory" in text_of(result)


async def test_read_caps_output(ctx: ToolContext) -> None:
    line = "x" * 99 + "\n"
    (ctx.cwd / "big.txt").write_text(line * 5000)  # 500 000 bytes
    result = await call(ReadFileTool(), ctx, path="big.txt")
    text = text_of(result)
    assert not result.is_error
    assert len(text.encode()) <= OUTPUT_CAP_BYTES + 200
    assert "truncated" in text
    shown = OUTPUT_CAP_BYTES // 100
    assert f"offset={shown + 1}" in text
    assert result.details is not None
    assert result.details["truncated"] is True
    assert result.details["total_lines"] == 5000


async def test_read_caps_single_huge_line(ctx: ToolContext) -> None:
    (ctx.cwd / "one.txt").write_text("é" * OUTPUT_CAP_BYTES)
    result = await call(ReadFileTool(), ctx, path="one.txt")
    text = text_of(result)
    assert "truncated" in text
    assert len(text.encode()) <= OUTPUT_CAP_BYTES + 200


# ------------------------------------------------------------------------------ path escape


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the working directory."""
    target = tmp_path / "secret.txt"
    target.write_text("secret\n")
    return target


def _escape_cases(ctx: ToolContext, outside: Path) -> list[str]:
    """Relative, absolute and symlinked paths that all resolve outside ``ctx.cwd``."""
    (ctx.cwd / "link").symlink_to(outside)
    (ctx.cwd / "dirlink").symlink_to(outside.parent)
    return ["../secret.txt", str(outside), "link", "dirlink/secret.txt", "../x"]


async def test_read_refuses_escape(ctx: ToolContext, outside: Path) -> None:
    for path in _escape_cases(ctx, outside):
        result = await call(ReadFileTool(), ctx, path=path)
        assert result.is_error, path
        assert path in text_of(result)
        assert "secret\n" not in text_of(result)


async def test_writes_refuse_escape(ctx: ToolContext, outside: Path) -> None:
    for path in _escape_cases(ctx, outside):
        for tool, extra in (
            (WriteFileTool(), {"content": "pwned"}),
            (EditFileTool(), {"old_text": "secret", "new_text": "pwned"}),
            (AppendFileTool(), {"content": "pwned"}),
        ):
            result = await call(tool, ctx, path=path, **extra)
            assert result.is_error, (tool.name, path)
            assert path in text_of(result)
            assert result.details is not None
            assert result.details["error"] == "path_escape"
    assert outside.read_text() == "secret\n"
    assert not (outside.parent / "x").exists()


async def test_reconcile_on_escape_is_unknown(ctx: ToolContext, outside: Path) -> None:
    (ctx.cwd / "link").symlink_to(outside)
    assert await reconcile(WriteFileTool(), ctx, path="link", content="secret\n") is None
    assert (
        await reconcile(EditFileTool(), ctx, path="link", old_text="zzz", new_text="secret") is None
    )


# ------------------------------------------------------------------------------------ write


async def test_write_creates_parents(ctx: ToolContext) -> None:
    result = await call(WriteFileTool(), ctx, path="a/b/c.txt", content="héllo")
    data = "héllo".encode()
    assert not result.is_error
    assert text_of(result) == f"wrote {len(data)} bytes to a/b/c.txt"
    assert (ctx.cwd / "a" / "b" / "c.txt").read_bytes() == data
    assert result.details == {
        "path": str((ctx.cwd / "a" / "b" / "c.txt").resolve()),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert [p.name for p in (ctx.cwd / "a" / "b").iterdir()] == ["c.txt"]


async def test_write_overwrites_and_keeps_mode(ctx: ToolContext) -> None:
    target = ctx.cwd / "run.sh"
    target.write_text("old")
    target.chmod(0o750)
    result = await call(WriteFileTool(), ctx, path="run.sh", content="new")
    assert not result.is_error
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o750


async def test_write_through_inside_symlink_replaces_target(ctx: ToolContext) -> None:
    (ctx.cwd / "real.txt").write_text("old")
    (ctx.cwd / "alias.txt").symlink_to(ctx.cwd / "real.txt")
    result = await call(WriteFileTool(), ctx, path="alias.txt", content="new")
    assert not result.is_error
    assert (ctx.cwd / "alias.txt").is_symlink()
    assert (ctx.cwd / "real.txt").read_text() == "new"


async def test_write_to_directory_is_error(ctx: ToolContext) -> None:
    (ctx.cwd / "d").mkdir()
    result = await call(WriteFileTool(), ctx, path="d", content="x")
    assert result.is_error
    assert "d" in text_of(result)


async def test_write_under_a_file_is_error(ctx: ToolContext) -> None:
    (ctx.cwd / "f").write_text("x")
    result = await call(WriteFileTool(), ctx, path="f/g.txt", content="x")
    assert result.is_error
    assert "f/g.txt" in text_of(result)


async def test_write_reconcile(ctx: ToolContext) -> None:
    tool = WriteFileTool()
    assert tool.can_reconcile
    assert await reconcile(tool, ctx, path="w.txt", content="abc") is None  # missing
    (ctx.cwd / "w.txt").write_text("abd")
    assert await reconcile(tool, ctx, path="w.txt", content="abc") is None  # differs
    executed = await call(tool, ctx, path="w.txt", content="abc")
    reconciled = await reconcile(tool, ctx, path="w.txt", content="abc")
    assert reconciled is not None
    assert not reconciled.is_error
    assert reconciled.content == executed.content
    assert executed.details is not None
    assert reconciled.details == {**executed.details, "reconciled": True}


# ------------------------------------------------------------------------------------- edit


async def test_edit_replaces_once(ctx: ToolContext) -> None:
    target = ctx.cwd / "e.py"
    target.write_bytes(b"a = 1\r\nb = 2\r\n")
    result = await call(EditFileTool(), ctx, path="e.py", old_text="b = 2", new_text="b = 3")
    assert not result.is_error
    assert target.read_bytes() == b"a = 1\r\nb = 3\r\n"
    assert result.details is not None
    assert result.details["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()


async def test_edit_missing_file(ctx: ToolContext) -> None:
    result = await call(EditFileTool(), ctx, path="none.py", old_text="a", new_text="b")
    assert result.is_error
    assert "none.py" in text_of(result)


async def test_edit_old_text_not_found(ctx: ToolContext) -> None:
    (ctx.cwd / "e.txt").write_text("hello")
    result = await call(EditFileTool(), ctx, path="e.txt", old_text="bye", new_text="x")
    assert result.is_error
    assert "not found" in text_of(result)
    assert (ctx.cwd / "e.txt").read_text() == "hello"


async def test_edit_old_text_not_unique(ctx: ToolContext) -> None:
    (ctx.cwd / "e.txt").write_text("x = 1\nx = 1\n")
    result = await call(EditFileTool(), ctx, path="e.txt", old_text="x = 1", new_text="y")
    assert result.is_error
    assert "2 times" in text_of(result)
    assert (ctx.cwd / "e.txt").read_text() == "x = 1\nx = 1\n"


async def test_edit_empty_old_text_rejected(ctx: ToolContext) -> None:
    with pytest.raises(ToolError):
        EditFileTool().parse_args({"path": "e.txt", "old_text": "", "new_text": "x"})


async def test_edit_reconcile(ctx: ToolContext) -> None:
    tool = EditFileTool()
    assert tool.can_reconcile
    args = {"path": "r.txt", "old_text": "alpha", "new_text": "beta"}
    assert await reconcile(tool, ctx, **args) is None  # missing
    (ctx.cwd / "r.txt").write_text("start alpha end")
    assert await reconcile(tool, ctx, **args) is None  # not applied yet
    executed = await call(tool, ctx, **args)
    assert not executed.is_error
    reconciled = await reconcile(tool, ctx, **args)
    assert reconciled is not None
    assert not reconciled.is_error
    assert reconciled.details is not None
    assert reconciled.details["reconciled"] is True
    (ctx.cwd / "r.txt").write_text("start gamma end")
    assert await reconcile(tool, ctx, **args) is None  # changed since


# ----------------------------------------------------------------------------------- append


async def test_append(ctx: ToolContext) -> None:
    tool = AppendFileTool()
    assert not tool.can_reconcile
    first = await call(tool, ctx, path="logs/log.txt", content="one\n")
    assert text_of(first) == "appended 4 bytes to logs/log.txt"
    await call(tool, ctx, path="logs/log.txt", content="twö\n")
    assert (ctx.cwd / "logs" / "log.txt").read_text() == "one\ntwö\n"


async def test_append_to_directory_is_error(ctx: ToolContext) -> None:
    (ctx.cwd / "d").mkdir()
    result = await call(AppendFileTool(), ctx, path="d", content="x")
    assert result.is_error


# ------------------------------------------------------------------------------------- bash


async def test_bash_output_and_exit_code(ctx: ToolContext) -> None:
    ok = await call(BashTool(), ctx, command="echo out; echo err >&2; pwd")
    assert not ok.is_error
    assert text_of(ok) == f"out\nerr\n{os.path.realpath(ctx.cwd)}\n"
    assert ok.details is not None
    assert ok.details["exit_code"] == 0
    bad = await call(BashTool(), ctx, command="echo partial; exit 3")
    assert bad.is_error
    assert text_of(bad) == "partial\nexit code 3"
    assert bad.details is not None
    assert bad.details["exit_code"] == 3


@pytest.mark.parametrize("runtime", ["pipe", "pty"])
async def test_a_command_beginning_with_a_dash_is_a_command(ctx: ToolContext, runtime: str) -> None:
    """``-c 'echo oops'`` or ``--version`` is what the model asked to run, not options of the
    tool's own ``bash``: the shell runs it (and finds no such command), as a terminal would."""
    for command in ("--version", "-c 'echo oops'"):
        result = await call(BashTool(runtime=runtime), ctx, command=command)
        assert result.details is not None and result.details["exit_code"] == 127, text_of(result)
        assert "command not found" in text_of(result) and "oops" not in text_of(result)


async def test_bash_no_output(ctx: ToolContext) -> None:
    result = await call(BashTool(), ctx, command="true")
    assert not result.is_error
    assert text_of(result) == "(no output)"


async def test_bash_env(ctx: ToolContext) -> None:
    result = await call(
        BashTool(),
        ctx,
        command='echo "$DURABLE_HARNESS_IDEMPOTENCY_KEY|$DURABLE_HARNESS_RUN_ID|'
        '$DURABLE_HARNESS_TOOL_CALL_ID|$EXTRA_VAR|${PATH:+path}"',
    )
    assert text_of(result) == "run-1:call-1|run-1|call-1|extra|path\n"


async def test_bash_output_keeps_tail(ctx: ToolContext) -> None:
    result = await call(BashTool(), ctx, command="head -c 400000 /dev/zero | tr '\\0' a; echo END")
    text = text_of(result)
    assert text.endswith("aEND\n")
    assert "truncated" in text
    assert len(text.encode()) <= OUTPUT_CAP_BYTES + 200
    assert result.details is not None
    assert result.details["output_bytes"] == 400004
    assert result.details["truncated"] is True


@pytest.mark.slow
async def test_bash_timeout_kills_group(ctx: ToolContext) -> None:
    with anyio.fail_after(PROMPTLY):
        result = await call(
            BashTool(), ctx, command="sleep 300 & echo $! > pid; echo started; wait", timeout=1
        )
    assert result.is_error
    assert "timed out" in text_of(result)
    assert "started" in text_of(result)
    assert result.details is not None
    assert result.details["timed_out"] is True
    pid = int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: pid_gone(pid)), f"background child {pid} survived"


@pytest.mark.slow
async def test_bash_timeout_kills_term_ignoring_child(ctx: ToolContext) -> None:
    command = "trap '' TERM; (trap '' TERM; exec sleep 300) & echo $! > pid; wait"
    with anyio.fail_after(PROMPTLY):
        result = await call(BashTool(), ctx, command=command, timeout=0.5)
    assert result.is_error
    pid = int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: pid_gone(pid))


async def test_bash_leftover_background_process_is_stopped(ctx: ToolContext) -> None:
    with anyio.fail_after(PROMPTLY):
        result = await call(BashTool(), ctx, command="sleep 300 & echo $! > pid; echo done")
    assert not result.is_error
    assert text_of(result) == "done\n"
    pid = int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: pid_gone(pid))


async def test_bash_cancellation_kills_group(ctx: ToolContext) -> None:
    with anyio.fail_after(PROMPTLY), anyio.move_on_after(0.5) as scope:
        await call(BashTool(), ctx, command="echo $$ > pgid; sleep 300 & echo $! > pid; wait")
    assert scope.cancelled_caught
    pgid = int((ctx.cwd / "pgid").read_text())
    pid = int((ctx.cwd / "pid").read_text())
    assert wait_until(lambda: group_gone(pgid) and pid_gone(pid))


async def test_bash_missing_cwd(tmp_path: Path) -> None:
    gone = ToolContext(
        cwd=tmp_path / "missing", run_id="r", tool_call_id="c", idempotency_key="r:c"
    )
    result = await call(BashTool(), gone, command="echo hi")
    assert result.is_error


# ---------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    ("name", "required", "optional"),
    [
        ("read_file", {"path"}, {"offset", "limit"}),
        ("write_file", {"path", "content"}, set()),
        ("edit_file", {"path", "old_text", "new_text"}, set()),
        ("append_file", {"path", "content"}, set()),
        ("bash", {"command"}, {"timeout"}),
    ],
)
def test_schemas(name: str, required: set[str], optional: set[str]) -> None:
    tool = builtin_tools()[name]
    spec = tool.spec()
    assert spec.name == name
    assert spec.description
    schema = spec.parameters
    assert schema["type"] == "object"
    assert set(schema["required"]) == required
    assert set(schema["properties"]) == required | optional
    for field in schema["properties"].values():
        assert field.get("description")


def test_builtin_tools_registry() -> None:
    tools = builtin_tools()
    assert set(tools) == {"read_file", "write_file", "edit_file", "append_file", "bash"}
    assert {name: tool.replay for name, tool in tools.items()} == {
        "read_file": "safe",
        "write_file": "never",
        "edit_file": "never",
        "append_file": "never",
        "bash": "never",
    }
    assert {name for name, tool in tools.items() if tool.can_reconcile} == {
        "write_file",
        "edit_file",
    }


def test_bad_arguments_raise_tool_error() -> None:
    with pytest.raises(ToolError, match="bash"):
        BashTool().parse_args({"command": "true", "timeout": -1})
    with pytest.raises(ToolError, match="read_file"):
        ReadFileTool().parse_args({"path": "a", "offset": 0})


@pytest.mark.slow
async def test_bash_pipe_held_outside_group_does_not_hang(ctx: ToolContext) -> None:
    # setsid moves the sleep out of the group (the tool cannot stop it); it keeps the output
    # pipe open for 300 s, and the tool must return long before.
    command = "setsid sh -c 'echo $$ > pid; exec sleep 300' & sleep 0.2; echo hi"
    try:
        with anyio.fail_after(PROMPTLY):
            result = await call(BashTool(), ctx, command=command)
        assert text_of(result) == "hi\n"
    finally:
        pid_file = ctx.cwd / "pid"  # the detached shell may write it after the tool returned
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        pid = int(pid_file.read_text())
        if not pid_gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_builtin_module_still_exports_what_it_did_before_the_split() -> None:
    """``durable_harness.tools.builtin`` only assembles now; every name code imported from it
    stays importable there and is the object its new home defines."""
    from durable_harness.tools import base, bash, builtin, env, files

    homes = {
        "OUTPUT_CAP_BYTES": base,
        "BashArgs": bash,
        "BashTool": bash,
        "SECRET_NAME_PATTERNS": env,
        "is_secret_name": env,
        "tool_environment": env,
        **{
            name: files
            for name in (
                "AppendFileArgs",
                "AppendFileTool",
                "EditFileArgs",
                "EditFileTool",
                "ReadFileArgs",
                "ReadFileTool",
                "WriteFileArgs",
                "WriteFileTool",
            )
        },
    }
    assert set(builtin.__all__) == {*homes, "builtin_tools"}
    for name, home in homes.items():
        assert getattr(builtin, name) is getattr(home, name), name
    assert sorted(builtin.builtin_tools()) == [
        "append_file",
        "bash",
        "edit_file",
        "read_file",
        "write_file",
    ]


def test_a_builtin_file_tool_can_be_subclassed_keeping_its_declaration() -> None:
    """A user's subclass of a built-in tool (a gated or logged ``append_file``) keeps the
    parent's name, argument model and verb, and may set its own ``replay`` in its body."""
    from durable_harness.tools.files import AppendFileTool, ReadFileTool

    class Logged(AppendFileTool):
        replay = "safe"

    class Plain(ReadFileTool):
        pass

    assert (Logged.name, Logged.Args, Logged.replay) == ("append_file", AppendFileTool.Args, "safe")
    assert AppendFileTool.replay == "never"
    assert (Plain.name, Plain.replay, Plain.verb) == ("read_file", "safe", ReadFileTool.verb)
