"""Refusing a ``retry`` while the call's process group may still run on another machine.

A ``bash`` call's group is recorded with the machine it runs on (``tool_process.host``). A
host on that machine kills a dead generation's group before it offers a plan
(``harness/groups.py``); a host on another machine cannot signal it, nor tell whether it
lives (a pgid names nothing there). Re-running such a call could run its effect twice at the
same time, so a ``retry`` decision for it is refused with
:class:`~durable_harness.errors.ToolProcessElsewhere` until the group is known dead (a
``tool_process_killed`` record, written by a host on that machine or by the operator's kill
there) or the operator forces it: the decision ``retry!`` (``{"decision": "retry", "force":
true}``), through the CLI (``--decide ID=retry!``), the API (``{"decision": "retry!"}``) and
the console ("Retry anyway"). ``fail`` and ``result`` are never refused: they run nothing.
The rule is in ``design/recovery.md``, "Process groups left running".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from durable_harness.errors import ToolProcessElsewhere
from durable_harness.harness.groups import elsewhere

if TYPE_CHECKING:
    from durable_harness.recovery.snapshot import Snapshot


def check_remote_retries(snapshot: Snapshot, given: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse the unforced ``retry`` decisions in ``given`` (keyed by call key, as
    :func:`~durable_harness.recovery.decide.resolve_decisions` returns them) whose call's group
    was recorded on another machine and is not known dead.

    Raises:
        ToolProcessElsewhere: the first such call (host and pid in the message and details).
    """
    for ls in snapshot.lanes:
        for call in ls.run.tool_calls if ls.run is not None else ():
            decision = given.get(call.key)
            if decision is None or decision.get("decision") != "retry" or decision.get("force"):
                continue
            far = elsewhere(call)
            if far is None:
                continue
            raise ToolProcessElsewhere(
                f"session {snapshot.session_id}: tool call {call.tool_call_id} was started on "
                f"host {far['host']} (process group {far['pid']}), which may still run it; "
                f"retrying could run it twice. Kill it there (POST "
                f"/sessions/{snapshot.session_id}/agent/kill on that machine) or decide "
                f"'retry!' to retry anyway",
                session_id=snapshot.session_id,
                tool_call_id=call.tool_call_id,
                host=far["host"],
                pid=far["pid"],
            )
