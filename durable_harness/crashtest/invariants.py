"""The crash kit's invariants, defined once (``design/testing-kit.md``): one function per
invariant, reading a cell's :class:`Evidence` and returning what broke; its name prefixes its
failures and its docstring's first paragraph is what the report prints (:data:`INVARIANTS`)."""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from durable_harness.crashtest.scenario import tool_effects
from durable_harness.models.content import text_of, tool_call_blocks
from durable_harness.recovery.audit import plan_followed
from durable_harness.recovery.decide import BENIGN_DAMAGE, RecoveryPlan
from durable_harness.recovery.fsck import fsck_path
from durable_harness.session.session import Session
from durable_harness.tools.base import Tool


@dataclass
class Cell:
    """One matrix cell's outcome.

    ``status``: ``pass``, ``fail`` or ``error``; ``failures`` names broken invariants;
    ``decisions``: ``"<tool call id>=<decision>"`` (``=policy:fail`` where the policy decided);
    ``notes`` explains ``n/a`` comparisons; ``reconciled``: tool call ids a ``reconcile``
    settled; ``doubled``: effects counted more than once.
    """

    scenario: str
    backend: str
    point: str
    hit: int
    status: str = "pass"
    failures: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    seconds: float = 0.0
    durability: str | None = None  # power-cut cells only: the mode under test
    lost: dict[str, list[str]] = field(default_factory=dict)  # power cut: ids lost, by kind
    reconciled: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``point`` or ``point:n``."""
        return self.point if self.hit == 1 else self.point_hit

    @property
    def point_hit(self) -> str:
        """``point:n``, as ``DURABLE_HARNESS_CRASH_AT`` names the crash."""
        return f"{self.point}:{self.hit}"


@dataclass
class Baseline:
    """A crash-free run: its conversation per lane, effect counts, and crash-point hits."""

    conversation: dict[str, list[Any]]
    effects: Counter[str]
    hits: Counter[str]


@dataclass
class Evidence:
    """What one cell's checks read: the cell (checks add ``notes`` and ``doubled``), the
    crash-free ``base``, the final ``session``, its ``work`` folder and store ``location``;
    ``unaccepted``: an input the crash kept from being accepted was sent only afterwards; the
    resume's ``planned`` plan, the records it wrote (``after``) and its outcome per lane."""

    cell: Cell
    base: Baseline
    session: Session
    work: Path
    location: str
    unaccepted: bool
    tools: dict[str, Tool] | None
    planned: RecoveryPlan
    after: list[dict[str, Any]]
    resumed: dict[str, str]

    @cached_property
    def paths(self) -> dict[str, list[dict[str, Any]]]:
        """Each lane's path, root to leaf."""
        lanes = self.session.store.lanes()
        return {n: self.session.path(lane.leaf_id) for n, lane in lanes.items()}

    @cached_property
    def effects(self) -> Counter[str]:
        """The effects applied, summed per tool (:func:`effects_in`)."""
        return effects_in(self.work, self.tools, per_tool=True)

    @cached_property
    def conversation(self) -> dict[str, list[Any]]:
        """The final :func:`conversation_of` the session."""
        return conversation_of(self.session)


def inputs(ev: Evidence) -> list[str]:
    """every accepted prompt, steer, follow-up and next-run item is in the tree once (or was
    cancelled by an abort)"""
    store, out = ev.session.store, []
    texts = Counter(
        text_of((e.get("message") or {}).get("content"))
        for p in ev.paths.values()
        for e in {id(x): x for x in p}.values()
        if e.get("type") == "message" and (e.get("message") or {}).get("role") == "user"
    )
    cancelled: set[str] = set()
    consumed: set[str] = set()
    for rec in store.records(types=("queue_consumed", "queue_cancelled")):
        (cancelled if rec["type"] == "queue_cancelled" else consumed).update(rec["itemIds"])
    for rec in store.records(types=("run_started", "queue_enqueued")):
        if rec["type"] == "run_started":
            if store.get_entry(str(rec["promptEntryId"])) is None:
                out.append(f"prompt entry of run {rec['runId']} missing")
            continue
        item = rec["itemId"]
        if item in cancelled:
            continue
        if item not in consumed:
            out.append(f"{rec['queue']} item {item} never delivered")
        elif texts[text_of(rec["message"].get("content"))] < 1:
            out.append(f"{rec['queue']} item {item} not in the tree")
    return out


def effects(ev: Evidence) -> list[str]:
    """no replay-never tool took effect twice (tags in effects.log, and the counts of a tool's
    own count_effects check), unless an explicit retry decision re-ran it"""
    cell = ev.cell
    cell.doubled = sorted(t for t, n in effects_in(ev.work, ev.tools).items() if n > 1)
    if cell.doubled and any(d.endswith("=retry") for d in cell.decisions):
        cell.notes.append(f"effects doubled by a retry decision: {', '.join(cell.doubled)}")
    elif cell.doubled:
        return [f"applied twice: {', '.join(cell.doubled)}"]
    same = ev.conversation == ev.base.conversation
    if same and ev.effects != ev.base.effects and not ev.unaccepted and not cell.doubled:
        return [f"{dict(ev.effects)} vs crash-free {dict(ev.base.effects)}"]
    return []


def damage(ev: Evidence) -> list[str]:
    """the session opens with no damage other than a quarantined torn tail"""
    if ev.location.endswith(".jsonl"):
        found = fsck_path(ev.location)["damage"]
    else:
        found = ev.session.damage
    bad = [d["kind"] for d in found if d["kind"] not in BENIGN_DAMAGE]
    return [f"{bad}"] if bad else []


def results(ev: Evidence) -> list[str]:
    """every stored tool call has exactly one stored result"""
    out = []
    for name, path in ev.paths.items():
        messages = [e.get("message") or {} for e in path]
        count = Counter(str(m.get("toolCallId")) for m in messages if m.get("role") == "toolResult")
        calls = [b for m in messages for b in m.get("content") or [] if isinstance(b, dict)]
        for cid in (str(b.get("id")) for b in calls if b.get("type") == "toolCall"):
            if count[cid] != 1:
                out.append(f"{cid} on lane {name} has {count[cid]} results")
    return out


def settled(ev: Evidence) -> list[str]:
    """no lane is left with an open run"""
    out = []
    if any(r == "suspended" for r in ev.resumed.values()):
        out.append(f"still suspended after decisions: {ev.resumed}")
    open_lanes = [n for n, lane in ev.session.store.lanes().items() if lane.run_id is not None]
    if open_lanes:
        out.append(f"lanes {open_lanes} still have an open run")
    return out


def plan(ev: Evidence) -> list[str]:
    """the resume did exactly what the recovery plan printed before it said (checked from the
    records it wrote)"""
    return plan_followed(ev.planned, ev.after)


def conversation(ev: Evidence) -> list[str]:
    """the final conversation equals the crash-free run's, except where a decision or a
    tool's reconcile established a call's result"""
    cell = ev.cell
    if ev.conversation == ev.base.conversation:
        return []
    if ev.unaccepted:
        cell.notes.append("conversation n/a: an input was not yet accepted at the crash")
    elif cell.decisions or cell.reconciled:
        cell.notes.append(
            "conversation changed by a decision or a reconciled result: "
            + "; ".join(cell.decisions + [f"{c}=reconciled" for c in cell.reconciled])
        )
    elif ev.effects != ev.base.effects:
        return [
            "differs from the crash-free run, and so do the effects "
            f"({dict(ev.effects)} vs {dict(ev.base.effects)})"
        ]
    else:
        return ["differs from the crash-free run"]
    return []


Check = Callable[[Evidence], list[str]]
"""An invariant: what broke in a cell, in words (nothing when it held)."""

CHECKS: tuple[Check, ...] = (inputs, effects, damage, results, settled, plan, conversation)
"""Every invariant, in the order a cell is checked (``effects`` sets ``cell.doubled`` first)."""

INVARIANTS: dict[str, str] = {
    check.__name__: " ".join(inspect.cleandoc(check.__doc__ or "").split("\n\n")[0].split())
    for check in CHECKS
}
"""``{name: meaning}`` of :data:`CHECKS`: what the report prints."""


def check_all(ev: Evidence) -> list[str]:
    """Every failure of every invariant, each as ``"<name>: <what broke>"``."""
    return [f"{check.__name__}: {problem}" for check in CHECKS for problem in check(ev)]


def effects_in(
    work: Path, tools: dict[str, Tool] | None = None, *, per_tool: bool = False
) -> Counter[str]:
    """The effects applied in ``work``: ``effects.log`` tags, plus the tools' own counts
    (:func:`~.scenario.tool_effects`), summed per tool (``"<tool>:*"``) with ``per_tool``."""
    log = work / "effects.log"
    out = (
        Counter(line.strip() for line in log.read_text().splitlines() if line.strip())
        if log.exists()
        else Counter()
    )
    if tools:
        for key, n in tool_effects(tools, work).items():
            out[key.split(":", 1)[0] + ":*" if per_tool else key] += n
    return out


def _signature(entry: dict[str, Any]) -> Any:
    etype = entry.get("type")
    if etype != "message":
        return (etype, entry.get("modelId"), entry.get("thinkingLevel"), entry.get("name"))
    msg = entry.get("message") or {}
    calls = [(b.get("name"), b.get("arguments")) for b in tool_call_blocks(msg.get("content"))]
    return (
        msg.get("role"),
        text_of(msg.get("content")),
        calls,
        msg.get("toolName"),
        msg.get("stopReason"),
    )


def conversation_of(session: Session) -> dict[str, list[Any]]:
    """Each lane's path from root to leaf as comparable signatures (no ids, no timestamps).
    The results of one parallel batch are sorted: their completion order is not part of the
    conversation (every result is tied to its call by id)."""
    out: dict[str, list[Any]] = {}
    for name, lane in sorted(session.store.lanes().items()):
        sigs: list[Any] = []
        batch: list[Any] = []
        for e in session.path(lane.leaf_id):
            if e.get("type") in ("branch_summary", "compaction"):
                continue
            sig = _signature(e)
            if sig[0] == "toolResult":
                batch.append(sig)
                continue
            sigs += sorted(batch, key=repr)
            batch = []
            sigs.append(sig)
        out[name] = sigs + sorted(batch, key=repr)
    return out
