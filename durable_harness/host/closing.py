"""The staged close of a live generation (``design/host.md``, "Closing"): cooperative abort,
a grace period, the kill step, bounded.

1. **Abort.** Every running lane is aborted with ``grace = close_grace``: ``abort_requested``
   is durable, the run is cancelled, a ``bash`` command gets SIGINT (pty runtime, its
   terminal's foreground group) and SIGTERM now and SIGKILL when the grace ends.
2. **Grace.** Up to ``close_grace`` seconds (plus :data:`SETTLE_SLACK`, so that a command its
   tool killed at the end of the grace can settle as aborted) for the runs to settle.
3. **Kill step.** The harness is fenced (:meth:`~durable_harness.harness.harness.Harness.
   fence`): nothing more is written to its lane logs, so a tool that ignored cancellation
   and answers later does not have its result recorded, and its call stays in doubt with its
   run open, exactly as after a crash (``recover`` shows it; a resume decides it). Then the
   process groups of unsettled calls are SIGKILLed and the generation is cancelled.
4. **Release.** Up to :data:`STOP_WAIT` seconds for the generation to stop; the caller then
   writes ``closed`` and releases the lease even if a tool (a thread that cannot be
   cancelled) is still holding the generation's task.

So ``close`` returns within ``close_grace + SETTLE_SLACK + STOP_WAIT`` (< grace + 2 s), plus
the bounded wait for a SIGKILLed group to die.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from durable_harness.errors import NoOpenRun
from durable_harness.harness.harness import Harness
from durable_harness.host.process import SessionProcess

__all__ = ["SETTLE_SLACK", "STOP_WAIT", "staged_close"]

SETTLE_SLACK = 0.5
"""Seconds after the grace for a run whose tool stopped at the grace's end to settle."""

STOP_WAIT = 1.0
"""Seconds after the kill step for the generation's task to stop before the close goes on
without it."""


async def staged_close(
    proc: SessionProcess, grace: float, kill_groups: Callable[[SessionProcess], None]
) -> None:
    """Run steps 1-3 of the staged close on ``proc`` (see the module docstring) and wait up
    to :data:`STOP_WAIT` seconds for its generation to stop; the caller releases it.

    Args:
        proc: a live generation, already recorded ``closing``.
        grace: seconds (``HostOptions.close_grace``).
        kill_groups: SIGKILLs the live groups of the generation's unsettled calls.
    """
    harness = proc.harness
    with anyio.move_on_after(grace + SETTLE_SLACK):
        if harness is not None:
            async with anyio.create_task_group() as tg:
                for lane in sorted(proc.running):
                    tg.start_soon(_abort, harness, lane, grace)
    if harness is not None:
        harness.fence()
    kill_groups(proc)
    proc.scope.cancel()
    with anyio.move_on_after(STOP_WAIT):
        await proc.stopped.wait()


async def _abort(harness: Harness, lane: str, grace: float) -> None:
    try:
        await harness.abort(lane=lane, grace=grace)
    except NoOpenRun:
        pass
