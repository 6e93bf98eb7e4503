"""A host process for the SIGKILL test: a :class:`SessionManager` whose sessions hold their tool
calls mid-flight until a gate file exists (imported by the test, run by it as a child).

Run as ``python host_child.py hold STORE_SPEC WORKDIR SCRIPT N``: creates ``N`` sessions in
``WORKDIR``, sends each the prompt ``task NN`` (:func:`prompt`), writes ``WORKDIR/ids.json``
(``{"NN": session id}``) and then waits forever: the test kills it. With
``python host_child.py one STORE_SPEC WORKDIR SCRIPT INDEX`` it creates one session and sends it
``task INDEX``; run with ``DURABLE_HARNESS_CRASH_AT=after_assistant_entry`` it SIGKILLs itself
once that session's assistant message (with its tool call) is durable and before the call's
intent: a call killed before it started.

Per session index ``i`` the scripted turn calls one tool (:data:`KINDS`, by ``i % 4``):

- ``bash`` (replay ``never``): appends ``i`` to ``effects/NN.log``, then waits for ``gate``;
- ``append`` (``append_file``, replay ``never``, gated): the append, then the wait;
- ``read`` (``read_file``, replay ``safe``, gated): the wait, then the read of ``inputs/NN.txt``.

Every effect is a line in ``effects/NN.log``, so the test counts how many times a call ran.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from durable_harness.fs import atomic_write
from durable_harness.host import HostOptions, SessionManager
from durable_harness.tools.base import Tool, ToolContext, ToolResult
from durable_harness.tools.builtin import AppendFileTool, ReadFileTool, builtin_tools

KINDS = ("bash", "append", "read", "bash")
GATE = "gate"


def kind(index: int) -> str:
    """The tool kind session ``index`` calls (``bash``, ``append`` or ``read``)."""
    return KINDS[index % len(KINDS)]


def prompt(index: int) -> str:
    """The prompt of session ``index`` (the key of its turns in the script)."""
    return f"task {index:02d}"


def effect_path(work: Path, index: int) -> Path:
    """The file each effect of session ``index``'s tool call appends one line to."""
    return work / "effects" / f"{index:02d}.log"


async def _wait_gate(cwd: Path) -> None:
    while not (cwd / GATE).exists():
        await anyio.sleep(0.02)


class GatedAppend(AppendFileTool):
    """``append_file`` that, after its append, waits until ``gate`` exists in the cwd."""

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Append (the effect), then hold the call open until the gate file exists."""
        result = await super().execute(args, ctx)
        await _wait_gate(ctx.cwd)
        return result


class GatedRead(ReadFileTool):
    """``read_file`` that waits until ``gate`` exists in the cwd before it reads."""

    async def execute(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Hold the call open until the gate file exists, then read."""
        await _wait_gate(ctx.cwd)
        return await super().execute(args, ctx)


def tools(runtime: str) -> Mapping[str, Tool]:
    """The tools of every generation: the built-ins, with the gated append and read."""
    out = builtin_tools()
    out["append_file"] = GatedAppend()
    out["read_file"] = GatedRead()
    return out


def tool_call(index: int) -> dict[str, Any]:
    """The one tool call of session ``index``'s first turn."""
    rel = f"effects/{index:02d}.log"
    k = kind(index)
    if k == "bash":
        command = f"printf '{index:02d}\\n' >> {rel} && while [ ! -e {GATE} ]; do sleep 0.02; done"
        return {"name": "bash", "arguments": {"command": command}}
    if k == "append":
        return {"name": "append_file", "arguments": {"path": rel, "content": f"{index:02d}\n"}}
    return {"name": "read_file", "arguments": {"path": f"inputs/{index:02d}.txt"}}


def write_script(path: Path, work: Path, count: int) -> None:
    """Write the scripted provider's file for sessions ``0..count-1`` and their input files."""
    (work / "effects").mkdir(parents=True, exist_ok=True)
    (work / "inputs").mkdir(parents=True, exist_ok=True)
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for i in range(count):
        (work / "inputs" / f"{i:02d}.txt").write_text(f"input of {i:02d}\n")
        if kind(i) == "read":
            effect_path(work, i).touch()  # read calls have no effect: the file stays empty
        by_prompt[prompt(i)] = [
            {"text": f"Working on {i:02d}.", "tool_calls": [tool_call(i)]},
            {"text": f"Done with {i:02d}."},
        ]
    path.write_text(json.dumps({"turns": [{"text": "no script"}], "by_prompt": by_prompt}))


def options(script: Path, **kw: Any) -> HostOptions:
    """The host options of the child and of the restarted host."""
    return HostOptions(provider=f"scripted:{script}", tools=tools, **kw)


async def hold(store: str, work: Path, script: Path, count: int) -> None:
    """Create ``count`` sessions, start their runs, publish their ids, wait to be killed."""
    async with SessionManager(store, options(script, auto_resume="never")) as manager:
        ids: dict[str, str] = {}
        for i in range(count):
            rec = await manager.create(str(work))
            await manager.send(rec.id, prompt(i))
            ids[f"{i:02d}"] = rec.id
        atomic_write(work / "ids.json", json.dumps(ids).encode())
        await anyio.sleep_forever()


async def one(store: str, work: Path, script: Path, index: int) -> None:
    """Create one session and run ``task INDEX`` (the crash point ends the process)."""
    async with SessionManager(store, options(script, auto_resume="never")) as manager:
        rec = await manager.create(str(work))
        atomic_write(work / f"id-{index:02d}", rec.id.encode())
        await manager.send(rec.id, prompt(index))
        await anyio.sleep_forever()


if __name__ == "__main__":
    verb, spec, work_dir, script_file, number = sys.argv[1:6]
    func = hold if verb == "hold" else one
    os.chdir(work_dir)
    anyio.run(func, spec, Path(work_dir), Path(script_file), int(number))
