"""The public surface (``design/api.md``): the pinned top-level names, the README's library
example run as written, the composed harness and its hooks."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import durable_harness
from durable_harness.errors import FormatError

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = [
    "DurableHarnessError",
    "Harness",
    "HarnessOptions",
    "RecoveryPlan",
    "RunHandle",
    "Session",
    "Tool",
    "ToolContext",
    "ToolResult",
    "__version__",
    "make_provider",
    "open_store",
    "recover",
    "resume",
]


def test_the_top_level_names_are_pinned() -> None:
    """Adding or removing a public name is a decision: change this list and design/api.md."""
    assert sorted(durable_harness.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(durable_harness, name) is not None
        assert name in dir(durable_harness)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        durable_harness.nope  # noqa: B018


def test_every_top_level_name_is_in_design_api() -> None:
    text = (ROOT / "design" / "api.md").read_text()
    missing = [n for n in PUBLIC if n != "__version__" and f"`{n}`" not in text]
    assert not missing, f"design/api.md does not name {missing}"


def test_importing_the_package_stays_cheap() -> None:
    """The names load on first use: ``import durable_harness`` does not pull in the harness
    or the providers (the command line starts without them)."""
    code = (
        "import sys, durable_harness; "
        "print(sorted(m for m in sys.modules if m.startswith(('durable_harness.harness.harness',"
        " 'durable_harness.providers', 'pydantic'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_open_store_memory() -> None:
    store = durable_harness.open_store("memory:")
    with durable_harness.Session(store.create_session("/p")) as session:
        assert store.resolve(session.id[:8]).id == session.id
        assert store.open_session(session.id) is session.store
        assert [i.id for i in store.list_sessions("/p")] == [session.id]
    assert durable_harness.open_store("memory:").list_sessions() == []  # each call: a new store
    with pytest.raises(FormatError, match="takes no path"):
        durable_harness.open_store("memory:/tmp/x")


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Library use") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Library use section has no python block"
    return match.group(1)


@pytest.mark.slow
def test_readme_library_example_runs_as_written(tmp_path: Path) -> None:
    code = _readme_example()
    imports = re.findall(r"^(?:from|import) (\S+)", code, re.M)
    assert {i for i in imports if i.startswith("durable_harness")} == {"durable_harness"}, (
        "the README example must use only the top level"
    )
    text = (ROOT / "README.md").read_text()
    script = re.search(r"`(\{\"turns\".*?\})`", text)
    assert script, "README names the script.json it runs with"
    (tmp_path / "script.json").write_text(script.group(1))
    (tmp_path / "example.py").write_text(code)
    warn = ["-W", "error::ResourceWarning", "-X", "tracemalloc=1"]
    proc = subprocess.run(
        [sys.executable, *warn, "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "completed"
    assert "ResourceWarning" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example.py", "script.json"]


@pytest.mark.slow
def test_readme_host_example_runs_after_the_library_example(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Library use") : text.index("## Crash-test your own agent")]
    library, host = re.findall(r"```python\n(.*?)```", section, re.S)
    script = re.search(r"`(\{\"turns\".*?\})`", text)
    assert script
    (tmp_path / "script.json").write_text(script.group(1))
    (tmp_path / "example.py").write_text(library + "\n" + host)
    proc = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "idle"]


def test_the_harness_is_composed_not_mixed_in() -> None:
    from durable_harness.harness.tool_calls import ToolCalls
    from durable_harness.harness.turns import Turns

    assert durable_harness.Harness.__mro__ == (durable_harness.Harness, object)
    assert Turns.__mro__ == (Turns, object) and ToolCalls.__mro__ == (ToolCalls, object)


def test_public_verbs_take_no_private_arguments() -> None:
    for name, fn in inspect.getmembers(durable_harness.Harness, inspect.isfunction):
        if name.startswith("_"):
            continue
        private = [p for p in inspect.signature(fn).parameters if p.startswith("_")]
        assert not private, f"Harness.{name} takes private arguments {private}"
    assert list(inspect.signature(durable_harness.Harness.compact).parameters) == ["self", "lane"]


def test_the_broken_build_uses_the_documented_hook() -> None:
    """The crash matrix's deliberately broken build is a ToolCalls subclass passed to the
    harness, not a patch of library code."""
    source = (ROOT / "durable_harness" / "crashtest" / "broken.py").read_text()
    assert "BrokenToolCalls(ToolCalls)" in source
    assert not re.search(r"^\s*\w+(\.\w+)+\s*=", source, re.M), "broken.py assigns into a module"
    child = (ROOT / "durable_harness" / "crashtest" / "child.py").read_text()
    assert "tool_calls=tool_calls" in child


def test_resume_is_the_recovery_entry_point() -> None:
    params = inspect.signature(durable_harness.resume).parameters
    assert list(params)[:2] == ["session", "tools"]
    assert inspect.iscoroutinefunction(durable_harness.resume)
    assert json.dumps(sorted(params)) == json.dumps(
        sorted(["session", "tools", "provider", "decisions", "policy", "options", "lanes"])
    )


@pytest.mark.anyio
async def test_recover_and_resume_from_the_top_level(tmp_path: Path) -> None:
    """A run left open mid-tool (its harness cancelled) is planned by ``recover`` and finished
    by ``resume``, using only top-level names and the ``memory:`` store."""
    import anyio
    from pydantic import BaseModel

    dh = durable_harness
    started = anyio.Event()
    calls: list[str] = []

    class Wait(dh.Tool):
        name = "wait"
        description = "Blocks the first time."
        replay = "safe"

        class Args(BaseModel):
            pass

        async def execute(self, args: BaseModel, ctx: dh.ToolContext) -> dh.ToolResult:
            calls.append(ctx.idempotency_key)
            if len(calls) == 1:
                started.set()
                await anyio.sleep_forever()
            return dh.ToolResult.text("waited")

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool_calls": [{"name": "wait"}]}, {"text": "done"}]}))
    tools = [Wait()]
    with dh.Session(dh.open_store("memory:").create_session(str(tmp_path))) as session:
        with anyio.CancelScope() as scope:
            async with dh.Harness(session, dh.make_provider(f"scripted:{script}"), tools) as h:
                await h.prompt("go")
                await started.wait()
                scope.cancel()
        plan = await anyio.to_thread.run_sync(dh.recover, session, tools)
        assert isinstance(plan, dh.RecoveryPlan)
        assert plan.lane("main").step().action == "resume_tool_calls"
        outcome = await dh.resume(session, tools, provider=dh.make_provider(f"scripted:{script}"))
        assert outcome == {"main": "completed"}
        assert len(calls) == 2 and calls[0] == calls[1]  # the same call, the same key
