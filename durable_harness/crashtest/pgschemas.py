"""The PostgreSQL schemas of a ``postgres`` crash-test run, reused from cell to cell
(``design/crash-matrix.md``, "PostgreSQL cells").

Each cell's store is a schema of its own in the run's database (``$DURABLE_HARNESS_CRASHTEST_PG``):
the cell's processes reach it through ``search_path``. Creating and migrating a schema cost
about 50 ms and dropping it 15-20 ms, a quarter of a PostgreSQL cell; so a schema the cell is
done with is emptied (its rows deleted in one transaction, its tables, functions and migration
versions kept) and handed to the next cell, which finds it exactly as a fresh, migrated store
with no session. A schema that cannot be emptied is dropped instead; every free schema is
dropped when the run ends (:func:`drop_free`), or at the latest when the process exits.
"""

from __future__ import annotations

import atexit
import threading
import uuid
from typing import Any

_lock = threading.Lock()
_free: dict[str, list[str]] = {}  # the run's database URL -> emptied schemas, last in first out
_tables: dict[tuple[str, str], list[str]] = {}  # (database, schema) -> its tables to empty
PREFIX = "ct_"
"""The prefix of a crash-test schema's name (``ct_`` and 20 hex digits)."""


def take(base: str) -> str:
    """A schema for one cell in database ``base``: an emptied one of an earlier cell, or a new
    one (``CREATE SCHEMA``, migrated by the first store that opens it).

    Raises:
        psycopg.Error: the server refused or cannot be reached.
    """
    with _lock:
        free = _free.get(base)
        if free:
            return free.pop()
    import psycopg

    schema = PREFIX + uuid.uuid4().hex[:20]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema


def spec(base: str, schema: str) -> str:
    """The libpq URL of ``schema`` in database ``base``: ``base`` with ``search_path`` set."""
    return base + ("&" if "?" in base else "?") + f"options=-csearch_path%3D{schema}"


def give_back(base: str, schema: str) -> None:
    """Empty ``schema`` (every row of every table but ``migrations``, one transaction, on a
    connection of this process's pool for it, then closed) and keep it for the next cell; drop
    it when it cannot be emptied. The cell's sessions must be closed first."""
    from durable_harness.storage.postgres.connection import Database

    def empty(conn: Any) -> list[str]:
        tables = _tables.get((base, schema))
        if tables is None:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s"
                " AND tablename <> 'migrations' ORDER BY tablename <> 'sessions', tablename",
                (schema,),
            ).fetchall()
            tables = [str(r[0]) for r in rows]
        with conn.transaction():
            # sessions first: every other table's rows go with it (ON DELETE CASCADE); the
            # other deletes then find nothing, but would empty a table a later version adds
            for table in tables:
                conn.execute(f'DELETE FROM {schema}."{table}"')
        return tables

    try:
        _tables[(base, schema)] = Database.get(spec(base, schema)).run(empty)
    except Exception:
        _drop(base, [schema])
        return
    finally:
        # closed, not kept for the next cell: a pool outliving a server restart between two
        # cells would hand the next one a dead connection
        Database.forget(spec(base, schema))
    with _lock:
        _free.setdefault(base, []).append(schema)


def drop_free(base: str | None = None) -> None:
    """Close this process's pools of the free schemas of database ``base`` (of every database
    when ``None``) and drop those schemas."""
    with _lock:
        bases = [base] if base is not None else list(_free)
        todo = {b: _free.pop(b, []) for b in bases}
    for b, schemas in todo.items():
        _drop(b, schemas)


def _drop(base: str, schemas: list[str]) -> None:
    """Close this process's pool of each of ``schemas`` and ``DROP SCHEMA ... CASCADE`` it; a
    server already gone is ignored (its cluster is being thrown away)."""
    if not schemas:
        return
    import psycopg

    from durable_harness.storage.postgres.connection import Database

    for schema in schemas:
        Database.forget(spec(base, schema))
        _tables.pop((base, schema), None)
    try:
        with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except psycopg.Error:
        pass


def _at_exit(*_: Any) -> None:
    drop_free()


atexit.register(_at_exit)
