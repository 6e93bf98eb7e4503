"""Delivering the host's notices (``design/notify.md``): signed POSTs to the ``--notify``
URLs, retried with backoff for a bounded time, at least once per event id, with a receipt
file so a restart sends only what was not acknowledged; and the unattended host's decision
timeout (``--decision-timeout``, ``--on-timeout``).

The notices themselves are derived from the store by :mod:`durable_harness.host.notices`;
this module owns nothing durable but the receipts.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from durable_harness.errors import DurableHarnessError
from durable_harness.host.notices import NOTICE_RECORD_TYPES, derive_notices, slack_text
from durable_harness.host.options import NotifyOptions
from durable_harness.host.read_model import parse_ts
from durable_harness.host.record import SessionRecord
from durable_harness.storage.base import SessionStore, Store

log = logging.getLogger("durable_harness.host.notify")

SIGNATURE_HEADER = "X-Durable-Harness-Signature"
"""``t=<unix seconds>,v1=<hex HMAC-SHA256 over "<t>." + body>`` (``design/notify.md``)."""
EVENT_ID_HEADER = "X-Durable-Harness-Event-Id"
"""The notice's stable event id: the receiver's deduplication key."""
SLACK_PREFIX = "slack+"
"""A ``--notify`` URL starting with it gets a Slack incoming-webhook body ``{"text"}``."""
RECEIPTS_FILE = "notices-sent.jsonl"
"""The receipts file's name beside a JSONL store's sessions (or a SQLite file's name plus
``.notices-sent.jsonl``)."""


def receipts_path(spec: str, home: str | None = None) -> Path:
    """The receipts file of the store ``spec``: ``DIR/notices-sent.jsonl`` for ``jsonl:DIR``,
    ``PATH.notices-sent.jsonl`` for ``sqlite:PATH``, else in ``home``
    (``$DURABLE_HARNESS_HOME``) named by a digest of the spec (never the spec: it may hold a
    password)."""
    scheme, _, rest = spec.partition(":")
    if scheme == "jsonl" and rest:
        return Path(rest).expanduser() / RECEIPTS_FILE
    if scheme == "sqlite" and rest:
        return Path(rest + "." + RECEIPTS_FILE).expanduser()
    base = Path(home or os.environ.get("DURABLE_HARNESS_HOME") or "~/.durable-harness")
    digest = hashlib.sha256(spec.encode()).hexdigest()[:16]
    return base.expanduser() / f"notices-sent-{digest}.jsonl"


def target_of(url: str) -> str:
    """A receiver's name in the receipts: 16 hex of SHA-256 of its URL (a webhook URL is a
    credential)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value of ``body`` sent at ``timestamp`` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, tolerance: float | None = 300.0) -> bool:
    """Whether ``header`` (:data:`SIGNATURE_HEADER`) signs ``body`` with ``secret``, and,
    with ``tolerance`` seconds, was made recently: what a receiver checks."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        stamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if tolerance is not None and abs(time.time() - stamp) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, stamp, body), f"t={stamp},v1={parts.get('v1', '')}")


def request_of(
    notice: Mapping[str, Any], url: str, secret: str | None
) -> tuple[str, bytes, dict[str, str]]:
    """``(url to POST, body, headers)`` of one notice for one receiver."""
    slack = url.startswith(SLACK_PREFIX)
    payload: Any = {"text": slack_text(notice)} if slack else notice
    body = orjson.dumps(payload)
    headers = {"Content-Type": "application/json", EVENT_ID_HEADER: str(notice["event_id"])}
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, int(time.time()), body)
    return (url[len(SLACK_PREFIX) :] if slack else url), body, headers


class Receipts:
    """The notices acknowledged, ``(event id, target)``, kept in a JSON-lines file appended
    and fsynced per receipt (a torn last line is skipped when read)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sent: set[tuple[str, str]] = set()
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            try:
                row = orjson.loads(line)
                self.sent.add((str(row["event_id"]), str(row["target"])))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue

    def add(self, event_id: str, target: str) -> None:
        """Record (durably) that ``target`` acknowledged ``event_id``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = orjson.dumps({"event_id": event_id, "target": target, "at": time.time()})
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                row = b"\n" + row  # a torn last line (a crash mid-append) stays on its own
            os.write(fd, row + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self.sent.add((event_id, target))


TIMEOUT_AUTHOR = "policy:timeout"
"""The author recorded on a decision the timeout policy made."""


class DeliveryFailed(Exception):
    """One POST was not acknowledged with a 2xx (retried by the delivery loop)."""


class NoticeHost(Protocol):
    """What the notifier needs of the manager (``SessionManager``)."""

    store: Store

    async def get(self, session_id: str) -> SessionRecord:
        """The session's record."""

    def open_read(self, session_id: str) -> SessionStore:
        """The session opened read-only."""

    def waiting(self, session_id: str) -> list[dict[str, Any]]:
        """The calls its plan waits on."""

    async def decide(
        self, session_id: str, tool_call_id: str, decision: str, *, author: str | None = None
    ) -> SessionRecord:
        """The one decide verb."""


class Notifier:
    """The manager's notice loop: sweeps sessions (those an event or a verb touched every
    ``interval``; all of them every ``full_every``), derives their notices, delivers each
    to each receiver not yet acknowledged, and applies the decision timeout."""

    def __init__(self, manager: NoticeHost, options: NotifyOptions) -> None:
        self.manager = manager
        self.options = options
        self.receipts = Receipts(options.receipts or receipts_path(manager.store.spec))
        self.dirty: set[str] = set()
        self.flying: set[tuple[str, str]] = set()
        self.timed_out: set[str] = set()
        self.scope = anyio.CancelScope()
        self._seen: dict[str, int] = {}
        # {session id: when its oldest waiting call's timeout falls due} (fail policy only)
        self.deadlines: dict[str, float] = {}

    def touch(self, session_id: str) -> None:
        """Sweep ``session_id`` on the next round (its facts may have changed)."""
        self.dirty.add(session_id)

    def stop(self) -> None:
        """Stop the loop and the deliveries in flight (what they had not sent is sent after
        the next start: no receipt was written)."""
        self.scope.cancel()

    async def run(self) -> None:
        """The loop, until :meth:`stop`."""
        with self.scope:
            while self.options.wait_for_url and self.options.public_url is None:
                await anyio.sleep(self.options.interval / 5)
            async with anyio.create_task_group() as tg:
                last_full = -float("inf")
                while True:
                    if time.monotonic() - last_full >= self.options.full_every:
                        last_full = time.monotonic()
                        ids = [i.id for i in self.manager.store.list_sessions() if not i.error]
                        self._seen.clear()
                    else:
                        now = time.time()
                        due = [sid for sid, at in self.deadlines.items() if at <= now]
                        ids = sorted(self.dirty.union(due))
                    self.dirty.clear()
                    for sid in ids:
                        await self._sweep(tg, sid)
                    await anyio.sleep(self.options.interval)

    async def _sweep(self, tg: anyio.abc.TaskGroup, session_id: str) -> None:
        """Derive one session's notices and start what is owed."""
        self.deadlines.pop(session_id, None)  # set again while a call still waits
        try:
            rec = await self.manager.get(session_id)
            with self.manager.open_read(session_id) as store:
                seq = store.last_seq()
                if self._seen.get(session_id) == seq and rec.state != "suspended":
                    return
                records = store.records(None, types=NOTICE_RECORD_TYPES)
            self._seen[session_id] = seq
            waiting = self.manager.waiting(session_id) if rec.state == "suspended" else []
        except DurableHarnessError as exc:
            log.debug("notices: session %s not read: %s", session_id, exc)
            return
        for notice in derive_notices(session_id, records, waiting, self.options.public_url):
            for url in self.options.urls:
                key = (str(notice["event_id"]), target_of(url))
                if key not in self.receipts.sent and key not in self.flying:
                    self.flying.add(key)
                    tg.start_soon(self._deliver, notice, url, key)
            if notice["kind"] == "decision_due":
                await self._timeout(notice)

    async def _timeout(self, notice: Mapping[str, Any]) -> None:
        """Decide ``fail`` (author :data:`TIMEOUT_AUTHOR`) a call that waited past the
        decision timeout, through the manager's one decide verb."""
        limit, since = self.options.decision_timeout, parse_ts(notice.get("at"))
        if limit is None or self.options.on_timeout != "fail" or since is None:
            return
        sid = str(notice["session_id"])
        if time.time() - since < limit:  # swept again once it is due
            self.deadlines[sid] = min(self.deadlines.get(sid, since + limit), since + limit)
            return
        if notice["event_id"] in self.timed_out:
            return
        self.timed_out.add(str(notice["event_id"]))
        call = str(notice["call_key"] or notice["call_id"])
        try:
            await self.manager.decide(sid, call, "fail", author=TIMEOUT_AUTHOR)
            log.warning("session %s: call %s waited %.0f s: decided fail", sid, call, limit)
        except DurableHarnessError as exc:
            log.warning("session %s: the timeout's decision was refused: %s", sid, exc)
        self.touch(sid)

    async def _deliver(self, notice: dict[str, Any], url: str, key: tuple[str, str]) -> None:
        """POST ``notice`` to ``url`` until a 2xx, with exponential backoff, for at most
        ``retry_for`` seconds; a receipt once acknowledged."""
        notice = {**notice, "link": notice.get("link")}
        if notice["link"] is None and self.options.public_url:
            sid = notice["session_id"]
            notice["link"] = f"{self.options.public_url.rstrip('/')}/console/sessions/{sid}"
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                async for attempt in AsyncRetrying(
                    stop=stop_after_delay(self.options.retry_for),
                    wait=wait_exponential(multiplier=0.1, min=0.1, max=5.0),
                    retry=retry_if_exception_type((httpx.HTTPError, DeliveryFailed)),
                    reraise=True,
                ):
                    with attempt:
                        target, body, headers = request_of(notice, url, self.options.secret)
                        answer = await client.post(target, content=body, headers=headers)
                        if not 200 <= answer.status_code < 300:
                            raise DeliveryFailed(f"HTTP {answer.status_code}")
            self.receipts.add(*key)
        except (httpx.HTTPError, DeliveryFailed, OSError) as exc:
            log.warning("notice %s (%s) not delivered: %s", key[0], notice["kind"], exc)
        finally:
            self.flying.discard(key)
