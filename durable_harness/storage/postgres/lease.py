"""Writer leases in the database: one ``leases`` row per session, its times on the database's clock;
acquire, renew (:class:`Heartbeat`), fence, release (``design/postgres.md`` "Leases and
fencing")."""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from typing import Any

import psycopg
import psycopg.errors

from durable_harness.errors import LeaseHeld, SessionNotFound, StorageError
from durable_harness.storage.postgres.connection import Database, backend_name, pid_namespace

DEFAULT_LEASE_S = 30.0
DEAD_HOLDER_WAIT_S = 10.0
"""The longest a takeover of a lease whose holder died on this host waits for the server to
finish that process's statements (:func:`wait_for_dead_holder`)."""
LEASE_ENV = "DURABLE_HARNESS_PG_LEASE_S"


def lease_seconds(value: float | None = None) -> float:
    """The lease duration in seconds: ``value``, else ``$DURABLE_HARNESS_PG_LEASE_S``, else
    :data:`DEFAULT_LEASE_S` (StorageError when not a positive number)."""
    raw: Any = value if value is not None else os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S
    try:
        secs = float(raw)
    except (TypeError, ValueError):
        secs = -1.0
    if not secs > 0:
        raise StorageError(f"lease duration {raw!r} is not a positive number of seconds")
    return secs


_HOLDER = (
    "SELECT pid, host, generation, owner, expires, broken FROM leases WHERE session_id = %s "
    "AND owner IS NOT NULL AND expires > clock_timestamp()"
)


def owner_token() -> str:
    """A new owner token: ``host:pid:pid-namespace:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{pid_namespace()}:{secrets.token_hex(8)}"


def dead_here(owner: str | None, pid: int | None) -> bool:
    """True when ``owner`` names a process of this host and pid namespace that no longer exists (its
    lease is free at once; a reused pid reads as alive)."""
    if not owner or pid is None:
        return False
    parts = owner.split(":")
    if len(parts) != 4 or parts[0] != socket.gethostname() or parts[2] != pid_namespace():
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def wait_for_dead_holder(
    conn: psycopg.Connection[Any], session_id: str, deadline_s: float = DEAD_HOLDER_WAIT_S
) -> None:
    """When the lease of ``session_id`` names a holder that died on this host (:func:`dead_here`),
    wait until the server has no backend of that process left (:func:`backend_name`), at most
    ``deadline_s`` seconds. The commits a SIGKILLed writer sent without waiting are still in
    its backends' sockets; a takeover that moved the generation first would have them refused
    by the fence, losing commits whose calls had returned. A backend of a dead client runs what
    it was sent, then reads the end of the connection and exits."""
    row = conn.execute(
        "SELECT owner, pid FROM leases WHERE session_id = %s", (session_id,)
    ).fetchone()
    if row is None or not dead_here(row[0], row[1]):
        return
    host, _pid, namespace, _rest = str(row[0]).split(":")
    name = backend_name(int(row[1]), host, namespace)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            left = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return  # a server that hides the view: take over at once, as before the wait
        if left is None or not left[0]:
            return
        time.sleep(0.01)


def live_holder(conn: psycopg.Connection[Any], session_id: str) -> dict[str, Any] | None:
    """The live holder of ``session_id``'s lease (``{"pid", "host", "generation", "owner",
    "expires", "broken"}``), or ``None`` when free, expired or :func:`dead_here`."""
    row = conn.execute(_HOLDER, (session_id,)).fetchone()
    if row is None or dead_here(row[3], row[0]):
        return None
    pid, host, generation, owner, expires, broken = row
    return {
        "pid": pid,
        "host": host,
        "generation": int(generation),
        "owner": owner,
        "expires": expires.isoformat() if expires is not None else None,
        "broken": bool(broken),
    }


def held_error(what: str, holder: dict[str, Any]) -> LeaseHeld:
    """The :class:`LeaseHeld` for a live ``holder`` of ``what``."""
    return LeaseHeld(
        f"{what} is open for writing by another live process (pid {holder.get('pid')} on "
        f"{holder.get('host')}, generation {holder.get('generation')}, lease until "
        f"{holder.get('expires')}); open it read-only, stop that process, or wait for its "
        "lease to expire",
        holder_pid=holder.get("pid"),
        holder_host=holder.get("host"),
        generation=holder.get("generation"),
    )


class DbLease:
    """The writer lease of one session, held through a :class:`Database`: its ``generation``
    (positive once acquired), ``owner`` token, ``lost`` (set when another writer took it) and
    ``seconds``."""

    def __init__(self, db: Database, session_id: str, what: str, seconds: float) -> None:
        self.db = db
        self.session_id = session_id
        self.what = what
        self.seconds = seconds
        self.generation = 0
        self.owner: str | None = None
        self.lost = False

    def acquire(self, *, break_lease: bool = False) -> int:
        """Take the lease; return the new generation.

        Raises:
            SessionNotFound: the session has no row.
            LeaseHeld: a live holder has it and ``break_lease`` is False.
        """
        owner = owner_token()
        self.db.run(lambda conn: wait_for_dead_holder(conn, self.session_id))

        def take(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO leases (session_id) SELECT id FROM sessions WHERE id = %s "
                    "ON CONFLICT (session_id) DO NOTHING",
                    (self.session_id,),
                )
                row = conn.execute(
                    "SELECT 1 FROM leases WHERE session_id = %s FOR UPDATE", (self.session_id,)
                ).fetchone()
                if row is None:
                    raise SessionNotFound(
                        f"no session {self.session_id} in {self.db.display}",
                        session_id=self.session_id,
                    )
                holder = live_holder(conn, self.session_id)
                live = holder is not None
                if holder is not None and not break_lease:
                    raise held_error(self.what, holder)
                got = conn.execute(
                    "UPDATE leases SET generation = generation + 1, owner = %s, host = %s, "
                    "pid = %s, acquired = clock_timestamp(), broken = %s, "
                    "expires = clock_timestamp() + make_interval(secs => %s) "
                    "WHERE session_id = %s RETURNING generation",
                    (owner, socket.gethostname(), os.getpid(), live, self.seconds, self.session_id),
                ).fetchone()
                assert got is not None
                return int(got[0])

        self.generation = self.db.run(take, idempotent=False)
        self.owner = owner
        self.lost = False
        Heartbeat.of(self.db).add(self)
        return self.generation

    def adopt(self, generation: int, owner: str) -> None:
        """Hold a lease a claim took for us: record it and start renewing it."""
        self.generation, self.owner, self.lost = generation, owner, False
        Heartbeat.of(self.db).add(self)

    def probe(self) -> dict[str, Any] | None:
        """The live holder (``"self": True`` when it is this lease), or ``None``."""
        holder = self.db.run(lambda conn: live_holder(conn, self.session_id))
        if holder is not None:
            holder["self"] = holder.get("owner") == self.owner and self.owner is not None
        return holder

    def release(self) -> None:
        """Give the lease up if it is still ours (the generation stays). Idempotent."""
        if self.owner is None:
            return
        self._give_up("owner = NULL, expires = NULL, pid = NULL")

    def expire(self) -> None:
        """Stop renewing and make the lease expire now, owner kept (as a crash), so a claim takes it
        at once. Never raises. When the server is away, a daemon thread tries again until the
        lease would have run out by itself (:meth:`_expire_when_back`): a worker's claim then
        takes the session as soon as the server is back, not a lease later."""
        if self.owner is None:
            return
        owner = self.owner
        try:
            self._give_up(_EXPIRE_NOW)
        except Exception:  # the server is away: expire it once it is back
            deadline = time.monotonic() + self.seconds
            threading.Thread(
                target=self._expire_when_back,
                args=(owner, deadline),
                name=f"lease-expire-{self.session_id}",
                daemon=True,
            ).start()

    def _expire_when_back(self, owner: str, deadline: float) -> None:
        """Expire the lease ``owner`` held, retrying (``Database.run_until``) until ``deadline``
        (``time.monotonic()``); a claim or a new owner meanwhile makes it a no-op."""
        try:
            self.db.run_until(
                lambda conn: _change_row(conn, self.session_id, owner, _EXPIRE_NOW), deadline
            )
        except Exception:  # still away: the lease has run out by itself by now
            pass

    def _give_up(self, change: str) -> None:
        """Stop renewing; apply ``change`` to the lease row if it is still ours."""
        owner, self.owner = self.owner, None
        Heartbeat.of(self.db).remove(self)
        self.db.run(lambda conn: _change_row(conn, self.session_id, owner, change), idempotent=True)


_EXPIRE_NOW = "expires = clock_timestamp()"


def _change_row(
    conn: psycopg.Connection[Any], session_id: str, owner: str | None, change: str
) -> None:
    """Apply ``change`` (a ``SET`` list) to ``session_id``'s lease row if ``owner`` still
    holds it (nothing otherwise: a claim or a new owner came first)."""
    conn.execute(
        f"UPDATE leases SET {change} WHERE session_id = %s AND owner = %s", (session_id, owner)
    )


class Heartbeat:
    """The thread renewing every lease one process holds in one database: one ``UPDATE`` every third
    of the shortest lease; from the first lease to the last."""

    _guard = threading.Lock()

    def __init__(self, db: Database) -> None:
        self.db = db
        self._leases: dict[int, DbLease] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, db: Database) -> Heartbeat:
        """The heartbeat of ``db`` in this process."""
        with cls._guard:
            hb = db.heartbeat
            if not isinstance(hb, Heartbeat):
                hb = db.heartbeat = cls(db)
            return hb

    def add(self, lease: DbLease) -> None:
        """Start renewing ``lease``."""
        with self._cond:
            self._leases[id(lease)] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name=f"lease-heartbeat {self.db.display}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def remove(self, lease: DbLease) -> None:
        """Stop renewing ``lease``."""
        with self._cond:
            self._leases.pop(id(lease), None)
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._leases:
                    self._thread = None
                    return
                interval = min(lease.seconds for lease in self._leases.values()) / 3
                deadline = time.monotonic() + interval
                while self._leases and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                leases = list(self._leases.values())
            if leases:
                try:
                    self.beat(leases)
                except Exception:  # the server is away: the next tick tries again
                    pass

    def beat(self, leases: list[DbLease]) -> None:
        """Renew ``leases`` in one statement; mark those another writer took as lost."""
        held = [lease for lease in leases if lease.owner is not None]
        if not held:
            return

        def renew(conn: psycopg.Connection[Any]) -> set[str]:
            rows = conn.execute(
                "UPDATE leases AS l SET "
                "expires = clock_timestamp() + make_interval(secs => h.secs) "
                "FROM unnest(%s::text[], %s::text[], %s::float8[]) AS h(sid, owner, secs) "
                "WHERE l.session_id = h.sid AND l.owner = h.owner RETURNING l.owner",
                (
                    [lease.session_id for lease in held],
                    [lease.owner for lease in held],
                    [lease.seconds for lease in held],
                ),
            ).fetchall()
            return {str(r[0]) for r in rows}

        renewed = self.db.run(renew)
        for lease in held:
            if lease.owner is not None and lease.owner not in renewed:
                lease.lost = True
                self.remove(lease)
