"""The schemas of a ``postgres`` crash-test run, reused from cell to cell
(``durable_harness/crashtest/pgschemas.py``): a schema given back is found by the next cell
exactly as a fresh migrated store (no session, no row, every migration), one that cannot be
emptied is dropped rather than reused, and the free ones are dropped at the end."""

from __future__ import annotations

from typing import Any

import pytest

from durable_harness.crashtest import pgschemas
from durable_harness.storage import EntryOp, open_store
from durable_harness.storage.postgres import MIGRATIONS
from durable_harness.storage.postgres.connection import Database


def _schemas(cluster: Any) -> set[str]:
    rows = cluster.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'ct\\_%'")
    return {str(r[0]) for r in rows}


def _a_cell(spec: str) -> str:
    """What a cell leaves in its store: a session with an entry, a lane, a lease."""
    store = open_store(spec)
    s = store.create_session("/cell")
    s.commit([EntryOp({"type": "message", "id": "e1", "parentId": None, "timestamp": "t",
                       "message": {"role": "user", "content": "hi"}}, lane="main")])  # fmt: skip
    s.close()
    return s.session_id


@pytest.fixture
def base(pg_cluster: Any) -> Any:
    yield pg_cluster.spec
    pgschemas.drop_free(pg_cluster.spec)
    # a test that took a schema gave it back: nothing of it stays in the shared cluster
    # (test_postgres_cells.py counts the cluster's crash-test schemas)
    assert _schemas(pg_cluster) == set()


def test_a_schema_given_back_is_a_fresh_migrated_store_for_the_next_cell(
    pg_cluster: Any, base: str
) -> None:
    first = pgschemas.take(base)
    spec = pgschemas.spec(base, first)
    sid = _a_cell(spec)
    pgschemas.give_back(base, first)
    assert pgschemas.take(base) == first  # reused, not created again
    tables = ("sessions", "leases", "entries", "records", "lanes", "lane_ops")
    for table in tables:
        assert pg_cluster.execute(f"SELECT count(*) FROM {first}.{table}") == [(0,)], table
    versions = pg_cluster.execute(f"SELECT count(*) FROM {first}.migrations")
    assert versions == [(len(MIGRATIONS),)]
    again = open_store(spec, create=False)  # a store, not "no such store"
    assert list(again.list_sessions()) == []
    assert _a_cell(spec) != sid
    pgschemas.give_back(base, first)


def test_a_schema_that_cannot_be_emptied_is_dropped_not_reused(pg_cluster: Any, base: str) -> None:
    bad = pgschemas.take(base)
    spec = pgschemas.spec(base, bad)
    sid = _a_cell(spec)
    # a row its delete cannot take: a table of someone else's holding on to the session
    pg_cluster.execute(
        f"CREATE TABLE {bad}.blocker (s TEXT REFERENCES {bad}.sessions (id));"
        f"INSERT INTO {bad}.blocker VALUES ('{sid}')"
    )
    pgschemas.give_back(base, bad)
    assert bad not in _schemas(pg_cluster)
    fresh = pgschemas.take(base)
    assert fresh != bad
    pgschemas.give_back(base, fresh)


def test_the_free_schemas_are_dropped_at_the_end_and_their_pools_closed(
    pg_cluster: Any, base: str
) -> None:
    taken = [pgschemas.take(base) for _ in range(3)]
    for schema in taken:
        _a_cell(pgschemas.spec(base, schema))
        pgschemas.give_back(base, schema)
    assert set(taken) <= _schemas(pg_cluster)
    pgschemas.drop_free(base)
    assert not set(taken) & _schemas(pg_cluster)
    assert all((k[1] != pgschemas.spec(base, s)) for k in Database._cache for s in taken)


def test_a_schema_given_back_before_a_server_restart_serves_the_next_cell(
    pg_cluster: Any, base: str
) -> None:
    schema = pgschemas.take(base)
    _a_cell(pgschemas.spec(base, schema))
    pgschemas.give_back(base, schema)
    pg_cluster.restart("immediate")  # every connection of this process is gone
    assert pgschemas.take(base) == schema
    _a_cell(pgschemas.spec(base, schema))  # no dead pooled connection handed to it
    pgschemas.give_back(base, schema)
