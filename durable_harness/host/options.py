"""How a :class:`~durable_harness.host.manager.SessionManager` runs its sessions
(``design/host.md``): :class:`HostOptions`, the default tools, and :func:`needs_decision`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from durable_harness.harness.core import Event, HarnessOptions
from durable_harness.host import worker
from durable_harness.host.record import CommandRuntime
from durable_harness.recovery.decide import Policy, RecoveryPlan
from durable_harness.storage.base import Durability
from durable_harness.tools.base import Tool
from durable_harness.tools.builtin import builtin_tools

ControlFactory = Callable[[Any, str], AbstractAsyncContextManager[int | None]]
"""Builds a generation's control endpoint from the
:class:`~durable_harness.host.manager.SessionManager` (typed ``Any`` here: the options come
before the manager that reads them) and a session id (see :attr:`HostOptions.control`)."""

SendMode = Literal["prompt", "steer", "follow_up"]
"""How a message enters a session: a new run, a steer into the running one, a follow-up."""

DEFAULT_RESUME_CONCURRENCY = 8
"""Start-up resumes in progress at once when ``HostOptions.resume_concurrency`` is not given."""

MAX_MESSAGE_BYTES = 1 << 20
"""The default limit of one message, in bytes of UTF-8 (1 MiB)."""


OnTimeout = Literal["fail", "keep"]
"""What the host does with a call that waited ``decision_timeout``: decide it ``fail``
(author ``policy:timeout``), or keep waiting (``design/notify.md``)."""


@dataclass
class NotifyOptions:
    """Where and how notices go (``design/notify.md``; delivered by
    :class:`~durable_harness.host.notify.Notifier`).

    Attributes:
        urls: the receivers (``https://...``; ``slack+https://...`` for a Slack body).
        secret: the HMAC-SHA256 key; ``None``: notices are sent unsigned.
        public_url: the console's base URL for links (``serve`` fills in its own address
            when ``--public-url`` is not given).
        wait_for_url: send nothing until ``public_url`` is set (``serve`` sets it once it
            answers, so the first notices already carry their links).
        receipts: the receipts file; ``None``: beside the store
            (:func:`~durable_harness.host.notify.receipts_path`).
        retry_for: seconds one notice is retried for before it waits for the next sweep.
        interval: seconds between two sweeps of the sessions that changed.
        full_every: seconds between two sweeps of every session (a change no event told of).
        decision_timeout: seconds a call may wait for a decision, counted from its intent's
            timestamp (``None``: forever); on_timeout: ``fail`` or ``keep``.
    """

    urls: tuple[str, ...] = ()
    secret: str | None = None
    public_url: str | None = None
    wait_for_url: bool = False
    receipts: Path | None = None
    retry_for: float = 120.0
    interval: float = 0.5
    full_every: float = 30.0
    decision_timeout: float | None = None
    on_timeout: OnTimeout = "keep"

    def active(self) -> bool:
        """Whether the host has anything to do: a URL, or a timeout that fails calls."""
        return bool(self.urls) or (self.decision_timeout is not None and self.on_timeout == "fail")


def default_tools(runtime: CommandRuntime) -> Mapping[str, Tool]:
    """The built-in tools, their bash running commands through ``runtime``."""
    return builtin_tools(runtime=runtime)


@dataclass
class HostOptions:
    """How the manager runs sessions.

    Attributes:
        provider: the provider spec of sessions created without one (``scripted:FILE``...).
        price: what providers' tokens cost (:func:`~durable_harness.providers.parse_price`);
            ``None``: a network provider's cost is unknown.
        mode: the durability mode of sessions created without one.
        policy: the recovery policy for in-doubt calls (``ask``: wait for a decision).
        auto_resume: at start-up, resume the suspended sessions whose plan needs no decision
            (``no_decision``), or none (``never``). These resumes run in the background once
            the manager is entered (``design/host.md``, "Start-up reconciliation").
        resume_concurrency: start-up resumes in progress at once (at least 1).
        close_grace: seconds a running turn is given after the abort, before the kill step.
        max_message_bytes: the largest message accepted, in bytes of UTF-8.
        tools: ``runtime -> {name: tool}``: the tools of a generation.
        harness: run-loop settings (the provider spec is set per session).
        control: ``(manager, session id) -> async context manager yielding a port or None``:
            each generation's control endpoint (``http.control.control_endpoint``), or None.
        claim_interval: seconds between claim rounds on a store that can claim
            (``host/worker.py``); ``None``: no claiming.
        roots: the directory trees sessions may be created in (``design/host.md``,
            "Roots"); ``None``: any directory.
        mcp: runtime the manager holds open while it is entered, before any session starts
            (the MCP servers of ``--mcp``: :class:`~durable_harness.tools.mcp.McpServers`,
            whose :meth:`~durable_harness.tools.mcp.McpServers.compose` is in ``tools``);
            ``None``: nothing.
        notify: the notices and the decision timeout (:class:`NotifyOptions`); ``None``:
            none.
        observers: ``(session id, event)`` callbacks the manager feeds every event of every
            generation (:meth:`~durable_harness.host.manager.SessionManager.observe`): the
            CLI's :class:`~durable_harness.host.tracing.HostTracer` when ``OTEL_*`` asks for
            traces (``design/observability.md``).
    """

    provider: str | None = None
    price: Mapping[str, Any] | None = None
    mode: Durability = "sync"
    policy: Policy = "ask"
    auto_resume: Literal["never", "no_decision"] = "no_decision"
    resume_concurrency: int = DEFAULT_RESUME_CONCURRENCY
    close_grace: float = 5.0
    max_message_bytes: int = MAX_MESSAGE_BYTES
    tools: Callable[[CommandRuntime], Mapping[str, Tool]] = default_tools
    harness: HarnessOptions = field(default_factory=HarnessOptions)
    control: ControlFactory | None = None
    claim_interval: float | None = worker.DEFAULT_CLAIM_INTERVAL_S
    roots: tuple[Path, ...] | None = None
    mcp: AbstractAsyncContextManager[Any] | None = None
    notify: NotifyOptions | None = None
    observers: list[Callable[[str, Event], None]] = field(default_factory=list)


def needs_decision(plan: RecoveryPlan) -> bool:
    """Whether resuming by ``plan`` would stop at an in-doubt call waiting for a decision."""
    return any(lp.waiting() or lp.next_action == "await_decision" for lp in plan.lanes)
