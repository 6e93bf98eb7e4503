"""Named crash points: ``DURABLE_HARNESS_CRASH_AT=<point>[:<n>]`` (read once, at import)
SIGKILLs the process at the n-th hit of that :func:`crash_point`, at the commit boundaries
``design/run-loop.md`` and ``design/recovery.md`` name (``design/crash-matrix.md``)."""

from __future__ import annotations

import os
import signal
import sys

CRASH_POINTS: dict[str, str] = {
    "after_run_started": "the run_started record is durable; no provider request yet",
    "after_provider_request_started": "a provider attempt's intent is durable; request not sent",
    "mid_provider_stream": "the provider is streaming its answer; nothing of it is stored",
    "after_assistant_entry": "the assistant entry and its settlement are durable; no tool begun "
    "(not hit when every call is replay-safe: the answer is written with the first intent)",
    "after_tool_started": "a tool_started intent is durable; the tool's effect has not begun",
    "after_tool_spawned": "bash's process group exists, unrecorded; its command has not begun",
    "after_tool_effect": "the tool's effect is done; its result is not written",
    "after_tool_finished": "the tool result entry and tool_finished are durable (not hit for a "
    "turn's last settlement: written with the save point and the next intent)",
    "before_save_point": "every tool call of the turn is settled; the save point is not written "
    "(hit only where the turn's settlement was written alone)",
    "after_save_point": "the save point between turns is durable (hit only where it is written "
    "alone: after an answer without tool calls)",
    "after_queue_enqueued": "a steer/follow-up/next-run receipt is durable",
    "after_abort_requested": "abort_requested is durable; the abort signal is not raised",
    "before_run_finished": "the final answer is stored; run_finished is not written",
    "after_run_finished": "run_finished is durable",
}

ENV_VAR = "DURABLE_HARNESS_CRASH_AT"
TRACE_VAR = "DURABLE_HARNESS_CRASH_TRACE"


def _from_env() -> tuple[str, int] | None:
    """The target named by the environment; a malformed one is reported and ignored (a typo in
    a test setting must not break every command)."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    name, _, count = value.partition(":")
    try:
        hit = int(count) if count else 1
    except ValueError:
        hit = 0
    if name in CRASH_POINTS and hit >= 1:
        return name, hit
    sys.stderr.write(
        f"durable-harness: ignoring {ENV_VAR}={value!r}: expected POINT[:N] "
        "with a point from `durable-harness crash-points`\n"
    )
    return None


_target = _from_env()
_trace = os.environ.get(TRACE_VAR)
_hits: dict[str, int] = {}


def rearm() -> None:
    """Read :data:`ENV_VAR` and :data:`TRACE_VAR` again and forget the hits counted so far: for a
    process forked from one that had imported this module (the crash matrix's fork server,
    ``design/crash-matrix.md`` "Warm children"), whose environment changed after the fork."""
    global _target, _trace
    _target = _from_env()
    _trace = os.environ.get(TRACE_VAR)
    _hits.clear()


def crash_point(name: str) -> None:
    """Count a hit of ``name`` and SIGKILL this process if it is the configured n-th hit; with
    ``DURABLE_HARNESS_CRASH_TRACE=FILE`` also append ``name`` to FILE (one a line)."""
    if _trace:
        fd = os.open(_trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, name.encode() + b"\n")
        finally:
            os.close(fd)
    if _target is None or _target[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
