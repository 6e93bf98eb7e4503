"""The crash-matrix child: plays a scenario's steps through the library, in its own process.

``python -m durable_harness.crashtest.child SCENARIO STORE CWD SID_FILE [--continue]
[--broken-intent-order]``. It writes the session id to SID_FILE as soon as the session exists.
Each input carries ``client_key="step-<i>"``; ``--continue`` plays only the steps never
accepted (``design/crash-matrix.md``); ``--broken-intent-order``: :mod:`.broken`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio

from durable_harness.crashtest.powercut import acked_keys, child_durability, record_ack
from durable_harness.crashtest.scenario import (
    Scenario,
    import_path,
    load,
    scenario_provider,
    scenario_tools,
)
from durable_harness.errors import NoOpenRun
from durable_harness.harness.harness import Harness, HarnessOptions, RunHandle
from durable_harness.harness.tool_calls import ToolCalls
from durable_harness.session.session import Session
from durable_harness.storage import open_store


def options(sc: Scenario) -> HarnessOptions:
    """Harness options for matrix runs: short retry waits. Under a scenario's small
    ``context_window``, ``keep_recent_tokens`` is the value the harness would clamp it to (half
    of ``context_window - compact_reserve``), set here so that no child warns about the clamp."""
    opts = HarnessOptions(retry_initial=0.01, retry_max=0.05, provider_spec=None)
    limit = (sc.context_window or 0) - opts.compact_reserve
    if limit > 0 and opts.keep_recent_tokens >= limit:
        opts.keep_recent_tokens = limit // 2
    return opts


def model_set(session: Session, step: dict[str, Any]) -> bool:
    """True when the session holds the ``model_change`` a ``set_model`` step makes (its
    acknowledgement may have been lost with the crash)."""
    model = step.get("model")
    return any(e.get("modelId") == model for e in session.store.iter_entries(("model_change",)))


def _already(session: Session, harness: Harness, i: int, step: dict[str, Any]) -> bool:
    op, lane = step["op"], step.get("lane", "main")
    if f"step-{i}" in acked_keys():  # power cut: the client got its ack before the store lost it
        return True
    if op in ("prompt", "steer", "follow_up", "next_run", "set_model"):
        accepted = harness.accepted(f"step-{i}", lane) is not None
        return accepted or (op == "set_model" and model_set(session, step))
    if op == "create_lane":
        return str(step["name"]) in session.store.lanes()
    if op == "navigate":
        return bool(session.store.iter_entries(("branch_summary",)))
    if op == "compact":
        return bool(session.store.iter_entries(("compaction",)))
    return bool(op == "abort")


async def play(sc: Scenario, session: Session, cont: bool, broken: bool = False) -> None:
    """Play the scenario's steps (see the module docstring); ``broken`` builds the harness with
    the deliberately broken tool path (:mod:`durable_harness.crashtest.broken`)."""
    handles: dict[str, RunHandle] = {}
    tool_calls: type[ToolCalls] = ToolCalls
    if broken:
        from durable_harness.crashtest.broken import BrokenToolCalls

        tool_calls = BrokenToolCalls
    tools, provider = scenario_tools(sc), scenario_provider(sc)
    harness = Harness(session, provider, tools, options=options(sc), tool_calls=tool_calls)
    async with harness as h:
        triggers: list[tuple[str, str, dict[str, Any], int]] = []
        # (type, lane) of every event since the play began: the runs go on while a step
        # awaits its barrier, so the event a later step waits "on" may come first
        seen: set[tuple[str, Any]] = set()

        def on_event(event: dict[str, Any]) -> None:
            seen.add((event["type"], event.get("lane")))
            for trig in list(triggers):
                etype, lane, step, i = trig
                if event["type"] == etype and event.get("lane") == lane:
                    triggers.remove(trig)
                    assert h.task_group is not None
                    h.task_group.start_soon(run_step, i, step)

        async def run_step(i: int, step: dict[str, Any]) -> None:
            op, lane, key = step["op"], step.get("lane", "main"), f"step-{i}"
            if op == "abort":
                await h.abort(lane=lane)
            elif op == "set_model":
                await h.set_model(step["provider"], step["model"], lane=lane, client_key=key)
                record_ack(key)

        h.subscribe(on_event)
        for i, step in enumerate(sc.steps):
            op, lane, key = step["op"], step.get("lane", "main"), f"step-{i}"
            if cont and _already(session, h, i, step):
                continue
            if step.get("on") and (step["on"], lane) in seen:
                await run_step(i, step)  # its event came before the steps ahead of it ended
            elif step.get("on"):
                triggers.append((step["on"], lane, step, i))
            elif op == "prompt":
                handles[lane] = await h.prompt(step["text"], lane=lane, client_key=key)
                record_ack(key)
            elif op in ("steer", "follow_up", "next_run"):
                try:
                    await getattr(h, op)(step["text"], lane=lane, client_key=key)
                    record_ack(key)
                except NoOpenRun:
                    if not cont:
                        raise
            elif op == "wait":
                if lane in handles:
                    await handles.pop(lane).wait()
            elif op == "navigate":
                path = session.path(session.leaf(lane))
                target = path[0]["id"] if step.get("target") == "root" and path else None
                await h.navigate(target, lane=lane, summarize=bool(step.get("summarize")))
            elif op == "compact":
                await h.compact(lane=lane)
            elif op == "create_lane":
                session.create_lane(step["name"])
            else:
                await run_step(i, step)


def main(argv: list[str]) -> int:
    """Entry point; see the module docstring for the arguments."""
    scenario, store_spec, cwd, sid_file = argv[:4]
    cont = "--continue" in argv
    broken = "--broken-intent-order" in argv
    sc = load(scenario)
    import_path()  # custom tools/provider import from the starting folder, not from `cwd`
    store = open_store(store_spec)
    durability = child_durability()
    if cont:
        with open(sid_file) as fh:
            session = Session(store.open_session(fh.read().strip(), durability=durability))
    else:
        session = Session(store.create_session(cwd, durability=durability))
        fd = os.open(sid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, session.id.encode())
        os.fsync(fd)
        os.close(fd)
    os.chdir(cwd)
    with session:
        anyio.run(play, sc, session, cont, broken)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
