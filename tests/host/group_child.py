"""A host process whose one session's ``bash`` call outlives it (imported by
``test_leftover_groups``, run by it as a child).

Run as ``python group_child.py VERB STORE_SPEC WORKDIR SCRIPT``: creates a session in
``WORKDIR``, writes its id to ``WORKDIR/id``, sends ``go`` and waits until the command's first
effect (``x`` in ``WORKDIR/effect``) is on disk. Then, by ``VERB``: ``hold`` waits to be
killed (``hold-elsewhere``: the same, its group recorded as host ``other-machine``'s);
``abort`` aborts the run and ``close`` closes the session, both meant to run with
``DURABLE_HARNESS_CRASH_AT=after_abort_requested`` so the host SIGKILLs itself once the abort
is durable (``close``: with ``closing`` written, in the middle of the close).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import anyio

from durable_harness.fs import atomic_write
from durable_harness.host import HostOptions, SessionManager

COMMAND = "echo x >> effect; while [ ! -e gate ]; do sleep 0.02; done; echo y >> effect"
"""The tool call's command: an effect, a hold until ``gate`` exists, a second effect."""


def write_script(path: Path) -> None:
    """Write the scripted provider's file: one bash call, then a final answer."""
    turns = [
        {"text": "Long job.", "tool_calls": [{"name": "bash", "arguments": {"command": COMMAND}}]},
        {"text": "Done."},
    ]
    path.write_text(json.dumps({"turns": turns}))


async def main(verb: str, spec: str, work: Path, script: Path) -> None:
    """Run the session to its first effect, then ``verb`` (see the module docstring)."""
    options = HostOptions(provider=f"scripted:{script}", auto_resume="never")
    async with SessionManager(spec, options) as manager:
        rec = await manager.create(str(work))
        atomic_write(work / "id", rec.id.encode())
        await manager.send(rec.id, "go")
        effect = work / "effect"
        while not (effect.exists() and effect.read_text() == "x\n"):
            await anyio.sleep(0.02)
        if verb == "abort":
            await manager.abort(rec.id)
        elif verb == "close":
            await manager.close(rec.id)
        await anyio.sleep_forever()


if __name__ == "__main__":
    verb_arg, spec_arg, work_arg, script_arg = sys.argv[1:5]
    if verb_arg == "hold-elsewhere":  # record the group as another machine's
        socket.gethostname = lambda: "other-machine"
    os.chdir(work_arg)
    anyio.run(main, verb_arg, spec_arg, Path(work_arg), Path(script_arg))
