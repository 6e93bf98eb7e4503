"""The PostgreSQL store's versioned schema, :data:`MIGRATIONS` (``design/postgres.md``,
"Schema"); an old migration is never edited."""

from __future__ import annotations

from typing import Any

import psycopg

from durable_harness.errors import StorageError
from durable_harness.ids import now_iso

# The PL/pgSQL that migrations 3 and 4 share, written once (each migration's text is unchanged).
_SHARED = {
    "{_ENTRY}": """                INSERT INTO entries (session_id, id, seq, parent_id, type, body)
                    VALUES (p_session, p_ids[i], seq, p_parents[i], p_types[i], p_bodies[i]);
""",
    "{_RECORD}": """            ELSIF p_kinds[i] = 'r' THEN
                INSERT INTO records (session_id, id, seq, lane, run_id, type, body)
                    VALUES (p_session, p_ids[i], seq, p_lanes[i], p_runs[i], p_types[i],
                            p_bodies[i]);
""",
    "{_LANE_OP}": """                INSERT INTO lane_ops (session_id, seq, lane, body)
                    VALUES (p_session, seq, p_lanes[i], p_bodies[i]);
                IF p_set_leaf[i] THEN
                    UPDATE lanes SET leaf_id = p_parents[i]
                        WHERE session_id = p_session AND name = p_lanes[i];
                END IF;
                IF p_configs[i] IS NOT NULL THEN
                    UPDATE lanes SET config = convert_to(p_configs[i], 'UTF8')
                        WHERE session_id = p_session AND name = p_lanes[i];
                END IF;
            END IF;
        END LOOP;
""",
}


def _shared(script: str) -> str:
    for marker, text in _SHARED.items():
        script = script.replace(marker, text)
    return script


MIGRATIONS: list[str] = [
    # 1: the tables (design/postgres.md, "Schema")
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY, cwd TEXT NOT NULL, created TEXT NOT NULL, modified TEXT NOT NULL,
        header BYTEA NOT NULL, last_seq BIGINT NOT NULL DEFAULT 0, name TEXT,
        parent_session TEXT);
    CREATE INDEX sessions_cwd ON sessions (cwd, modified);
    CREATE INDEX sessions_modified ON sessions (modified);
    CREATE TABLE leases (
        session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
        generation BIGINT NOT NULL DEFAULT 0, owner TEXT, host TEXT, pid INTEGER,
        acquired TIMESTAMPTZ, expires TIMESTAMPTZ, broken BOOLEAN NOT NULL DEFAULT FALSE);
    CREATE INDEX leases_expires ON leases (expires);
    CREATE TABLE entries (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        id TEXT NOT NULL, seq BIGINT NOT NULL, parent_id TEXT, type TEXT NOT NULL,
        body BYTEA NOT NULL,
        CONSTRAINT entries_pkey PRIMARY KEY (session_id, id),
        CONSTRAINT entries_seq UNIQUE (session_id, seq),
        CONSTRAINT entries_parent FOREIGN KEY (session_id, parent_id)
            REFERENCES entries (session_id, id));
    CREATE TABLE records (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        id TEXT NOT NULL, seq BIGINT NOT NULL, lane TEXT, run_id TEXT, type TEXT NOT NULL,
        body BYTEA NOT NULL,
        CONSTRAINT records_pkey PRIMARY KEY (session_id, id),
        CONSTRAINT records_seq UNIQUE (session_id, seq));
    CREATE INDEX records_lane ON records (session_id, lane, seq);
    CREATE INDEX records_run ON records (session_id, run_id, seq);
    CREATE TABLE lanes (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        name TEXT NOT NULL, leaf_id TEXT, config BYTEA NOT NULL, run_id TEXT, run_seq BIGINT,
        CONSTRAINT lanes_pkey PRIMARY KEY (session_id, name),
        CONSTRAINT lanes_leaf FOREIGN KEY (session_id, leaf_id)
            REFERENCES entries (session_id, id));
    CREATE TABLE lane_ops (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq BIGINT NOT NULL, lane TEXT NOT NULL, body BYTEA NOT NULL,
        CONSTRAINT lane_ops_pkey PRIMARY KEY (session_id, seq));
    """,
    # 2: the fence as one call, dh_fence (SQLSTATEs DH001-DH003 are ours)
    """
    CREATE FUNCTION dh_fence(p_session TEXT, p_generation BIGINT, p_last_seq BIGINT)
    RETURNS VOID LANGUAGE plpgsql AS $fence$
    DECLARE
        g BIGINT;
        l BIGINT;
    BEGIN
        SELECT lz.generation, s.last_seq INTO g, l
            FROM sessions s JOIN leases lz ON lz.session_id = s.id
            WHERE s.id = p_session FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'session % does not exist', p_session USING ERRCODE = 'DH001';
        END IF;
        IF g <> p_generation THEN
            RAISE EXCEPTION 'lease generation is %', g USING ERRCODE = 'DH002';
        END IF;
        IF l <> p_last_seq THEN
            RAISE EXCEPTION 'last_seq is %', l USING ERRCODE = 'DH003';
        END IF;
    END
    $fence$;
    """,
    # 3: a whole commit as one statement, dh_commit, the ops as parallel arrays
    _shared("""
    CREATE FUNCTION dh_commit(
        p_session TEXT, p_generation BIGINT, p_last_seq BIGINT, p_sync BOOLEAN,
        p_modified TEXT, p_kinds TEXT[], p_ids TEXT[], p_parents TEXT[], p_types TEXT[],
        p_lanes TEXT[], p_runs TEXT[], p_bodies BYTEA[], p_set_leaf BOOLEAN[],
        p_configs TEXT[])
    RETURNS BIGINT LANGUAGE plpgsql AS $commit$
    DECLARE
        i INT;
        seq BIGINT := p_last_seq;
    BEGIN
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        PERFORM dh_fence(p_session, p_generation, p_last_seq);
        FOR i IN 1 .. coalesce(array_length(p_kinds, 1), 0) LOOP
            seq := seq + 1;
            IF p_kinds[i] = 'e' THEN
{_ENTRY}                IF p_lanes[i] IS NOT NULL THEN
                    INSERT INTO lanes (session_id, name, leaf_id, config)
                        VALUES (p_session, p_lanes[i], p_ids[i], '{}')
                        ON CONFLICT (session_id, name) DO UPDATE SET leaf_id = excluded.leaf_id;
                END IF;
{_RECORD}                IF p_lanes[i] IS NOT NULL THEN
                    IF p_types[i] = 'run_started' THEN
                        INSERT INTO lanes (session_id, name, config, run_id, run_seq)
                            VALUES (p_session, p_lanes[i], '{}', p_runs[i], seq)
                            ON CONFLICT (session_id, name) DO UPDATE
                            SET run_id = excluded.run_id, run_seq = excluded.run_seq;
                    ELSE
                        INSERT INTO lanes (session_id, name, config)
                            VALUES (p_session, p_lanes[i], '{}')
                            ON CONFLICT (session_id, name) DO NOTHING;
                        IF p_types[i] = 'run_finished' THEN
                            UPDATE lanes SET run_id = NULL, run_seq = NULL
                                WHERE session_id = p_session AND name = p_lanes[i]
                                AND run_id = p_runs[i];
                        END IF;
                    END IF;
                END IF;
            ELSE
                INSERT INTO lanes (session_id, name, config) VALUES (p_session, p_lanes[i], '{}')
                    ON CONFLICT (session_id, name) DO NOTHING;
{_LANE_OP}        UPDATE sessions SET last_seq = seq, modified = p_modified WHERE id = p_session;
        RETURN seq;
    END
    $commit$;
    """),
    # 4: dh_write, the commit with less work per call (design/postgres.md, "Commit")
    _shared("""
    DROP FUNCTION dh_commit(TEXT, BIGINT, BIGINT, BOOLEAN, TEXT, TEXT[], TEXT[], TEXT[], TEXT[],
        TEXT[], TEXT[], BYTEA[], BOOLEAN[], TEXT[]);
    DROP FUNCTION dh_fence(TEXT, BIGINT, BIGINT);
    CREATE FUNCTION dh_write(
        p_session TEXT, p_generation BIGINT, p_last_seq BIGINT, p_sync BOOLEAN,
        p_modified TEXT, p_kinds TEXT[], p_ids TEXT[], p_parents TEXT[], p_types TEXT[],
        p_lanes TEXT[], p_runs TEXT[], p_bodies BYTEA[], p_set_leaf BOOLEAN[],
        p_configs TEXT[], p_new_lanes TEXT[])
    RETURNS BIGINT LANGUAGE plpgsql AS $write$
    DECLARE
        i INT;
        n INT := coalesce(array_length(p_kinds, 1), 0);
        seq BIGINT := p_last_seq;
        g BIGINT;
        l BIGINT;
    BEGIN
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        UPDATE sessions SET last_seq = p_last_seq + n, modified = p_modified
            WHERE id = p_session AND last_seq = p_last_seq;
        IF NOT FOUND THEN
            SELECT s.last_seq, lz.generation INTO l, g
                FROM sessions s LEFT JOIN leases lz ON lz.session_id = s.id
                WHERE s.id = p_session;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'session % does not exist', p_session USING ERRCODE = 'DH001';
            END IF;
            IF g IS DISTINCT FROM p_generation THEN
                RAISE EXCEPTION 'lease generation is %', coalesce(g, 0) USING ERRCODE = 'DH002';
            END IF;
            RAISE EXCEPTION 'last_seq is %', l USING ERRCODE = 'DH003';
        END IF;
        SELECT generation INTO g FROM leases WHERE session_id = p_session FOR SHARE;
        IF g IS DISTINCT FROM p_generation THEN
            RAISE EXCEPTION 'lease generation is %', coalesce(g, 0) USING ERRCODE = 'DH002';
        END IF;
        IF p_new_lanes IS NOT NULL THEN
            INSERT INTO lanes (session_id, name, config)
                SELECT p_session, x, '{}' FROM unnest(p_new_lanes) AS x
                ON CONFLICT (session_id, name) DO NOTHING;
        END IF;
        FOR i IN 1 .. n LOOP
            seq := seq + 1;
            IF p_kinds[i] = 'e' THEN
{_ENTRY}                IF p_lanes[i] IS NOT NULL THEN
                    UPDATE lanes SET leaf_id = p_ids[i]
                        WHERE session_id = p_session AND name = p_lanes[i];
                END IF;
{_RECORD}                IF p_lanes[i] IS NOT NULL THEN
                    IF p_types[i] = 'run_started' THEN
                        UPDATE lanes SET run_id = p_runs[i], run_seq = seq
                            WHERE session_id = p_session AND name = p_lanes[i];
                    ELSIF p_types[i] = 'run_finished' THEN
                        UPDATE lanes SET run_id = NULL, run_seq = NULL
                            WHERE session_id = p_session AND name = p_lanes[i]
                            AND run_id = p_runs[i];
                    END IF;
                END IF;
            ELSE
{_LANE_OP}        RETURN seq;
    END
    $write$;
    """),
]


def check_not_newer(version: int, display: str) -> None:
    """Raise :class:`StorageError` when ``version`` is past the migrations this code knows."""
    if version > len(MIGRATIONS):
        raise StorageError(
            f"{display}: the store's schema is at version {version}, newer than this "
            f"durable-harness knows ({len(MIGRATIONS)}): upgrade durable-harness",
            path=display,
            version=version,
        )


def migrate(conn: psycopg.Connection[Any], display: str) -> list[int]:
    """Apply every migration past the database's version (each in one transaction with its
    version row, under an advisory lock); return the versions applied.

    Raises:
        StorageError: the schema is newer than this code knows.
    """
    applied: list[int] = []
    for version, script in enumerate(MIGRATIONS, start=1):
        with conn.transaction():
            # the lock first: two processes creating the table at once collide in the
            # catalogue even with IF NOT EXISTS
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.durable_harness'))"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, "
                "applied TEXT NOT NULL)"
            )
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM migrations").fetchone()
            current = int(row[0]) if row else 0
            check_not_newer(current, display)
            if current >= version:
                continue
            conn.execute(script)  # several statements, no parameters: one simple query
            conn.execute("INSERT INTO migrations VALUES (%s, %s)", (version, now_iso()))
            applied.append(version)
    return applied
