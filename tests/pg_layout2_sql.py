"""The previous release's PostgreSQL commit path (layout 2: every commit serialised on
the quick_meta row), its SQL frozen as it shipped in ``9fc77e6``, so tests can turn a store
into one of that layout and commit into it as that release's processes did (issue 42
point 4: migration and rolling upgrade). Only what those tests use is kept; the helpers
that compose names are the backend's own. Never imported by quickzones itself."""

from __future__ import annotations

import functools

from psycopg import sql as pgsql

from quickzones.backends.postgres.sql import _function, compose


class Layout2:
    """The layout-2 statements of one schema."""

    def __init__(self, schema: str) -> None:
        s = schema
        self._names: dict[str, pgsql.Composable] = {
            "kv": pgsql.Identifier(s, "kv"),
            "meta": pgsql.Identifier(s, "quick_meta"),
            "conflicts": pgsql.Identifier(s, "quick_conflicts"),
            "resolve": pgsql.Identifier(s, "quick_resolve"),
            "commit": pgsql.Identifier(s, "quick_commit"),
            "add": pgsql.Identifier(s, "quick_add"),
            "conflict_state": pgsql.Literal("QK020"),
            "moved_state": pgsql.Literal("QK021"),
        }

    def _q(self, template: str) -> str:
        return compose(template, **self._names)

    def _function(self, head: str, body: str) -> str:
        return _function(head, body, **self._names)

    @functools.cached_property
    def conflicts_layout(self) -> tuple[str, ...]:
        """quick_conflicts, quick_resolve and quick_commit as layout 2 had them."""
        overlaps = (
            "EXISTS (SELECT 1 FROM {{conflicts}} c, unnest(c.begins, c.ends) w(b, e),"
            " unnest({b}, {e}) r(b, e) WHERE c.version > {since} AND w.b < r.e AND r.b < w.e)"
        )
        reads = overlaps.format(b="p_rb", e="p_re", since="p_rv")
        moved = overlaps.format(b="p_ab", e="p_ae", since="p_since")
        return (
            self._q(
                "CREATE TABLE {conflicts} (version bigint PRIMARY KEY,"
                " begins bytea[] NOT NULL, ends bytea[] NOT NULL)"
            ),
            self._function(
                """CREATE OR REPLACE FUNCTION {resolve}(p_rv bigint, p_rb bytea[],
    p_re bytea[], p_since bigint, p_ab bytea[], p_ae bytea[], p_wb bytea[], p_we bytea[],
    p_at_least bigint) RETURNS bigint LANGUAGE plpgsql""",
                f"""
DECLARE
    locked bigint;
    committed bigint;
BEGIN
    SELECT version INTO locked FROM {{meta}} WHERE id = 0 FOR UPDATE;
    IF p_rv IS NOT NULL AND locked > p_rv AND cardinality(p_rb) > 0 AND {reads} THEN
        RAISE EXCEPTION 'a read conflicts with a later commit' USING ERRCODE = {{conflict_state}};
    END IF;
    IF p_since IS NOT NULL AND (locked >= p_at_least
            OR (locked > p_since AND cardinality(p_ab) > 0 AND {moved})) THEN
        RAISE EXCEPTION 'the commit''s operands moved' USING ERRCODE = {{moved_state}};
    END IF;
    committed := greatest(locked + 1, p_at_least);
    INSERT INTO {{conflicts}} (version, begins, ends) VALUES (committed, p_wb, p_we);
    UPDATE {{meta}} SET version = committed WHERE id = 0;
    RETURN committed;
END """,
            ),
            self._function(
                """CREATE OR REPLACE FUNCTION {commit}(p_rv bigint, p_rb bytea[],
    p_re bytea[], p_since bigint, p_ab bytea[], p_ae bytea[], p_wb bytea[], p_we bytea[],
    p_at_least bigint, p_cb bytea[], p_ce bytea[], p_sk bytea[], p_sv bytea[],
    p_dk bytea[], p_ak bytea[], p_av bytea[]) RETURNS bigint LANGUAGE plpgsql""",
                """
DECLARE
    committed bigint;
BEGIN
    committed := {resolve}(p_rv, p_rb, p_re, p_since, p_ab, p_ae, p_wb, p_we,
        p_at_least);
    FOR i IN 1 .. coalesce(cardinality(p_cb), 0) LOOP
        DELETE FROM {kv} WHERE key >= p_cb[i] AND key < p_ce[i];
    END LOOP;
    IF cardinality(p_sk) > 0 THEN
        INSERT INTO {kv} (key, value) SELECT * FROM unnest(p_sk, p_sv)
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    END IF;
    IF cardinality(p_dk) > 0 THEN
        DELETE FROM {kv} WHERE key = ANY(p_dk);
    END IF;
    IF cardinality(p_ak) > 0 THEN
        INSERT INTO {kv} AS t (key, value) SELECT * FROM unnest(p_ak, p_av)
            ON CONFLICT (key) DO UPDATE SET value = {add}(t.value, excluded.value);
    END IF;
    RETURN committed;
END """,
            ),
        )

    @functools.cached_property
    def version(self) -> str:
        return self._q("SELECT version FROM {meta} WHERE id = 0")

    @functools.cached_property
    def commit(self) -> str:
        marks = "%s, %b, %b, %s, %b, %b, %b, %b, %s, %b, %b, %b, %b, %b, %b, %b"
        return self._q(f"SELECT {{commit}}({marks})")


def make_layout_2(admin: object, schema: str) -> None:
    """Turn the layout-3 store in ``schema`` into the layout-2 store the previous release
    would have made with the same items (``admin``: an autocommit psycopg connection)."""
    old = Layout2(schema)
    s = compose("{s}", s=pgsql.Identifier(schema))
    run = admin.execute  # type: ignore[attr-defined]
    (last,) = run(f"SELECT last_value FROM {s}.quick_versions").fetchone()
    run(f"DROP TABLE {s}.quick_log")
    run(f"DROP SEQUENCE {s}.quick_versions")
    run(f"DROP FUNCTION {s}.quick_commit3")
    for statement in old.conflicts_layout:
        run(statement)
    run(f"UPDATE {s}.quick_meta SET version = %s, format_version = 2", (last,))


def commit_as_layout_2(conn: object, schema: str, key: bytes, value: bytes) -> int:
    """One commit setting ``key`` as a process of the previous release sends it (its
    resolver's one statement), on an autocommit psycopg connection; returns its version."""
    old = Layout2(schema)
    run = conn.execute  # type: ignore[attr-defined]
    with conn.transaction():  # type: ignore[attr-defined]
        (rv,) = run(old.version).fetchone()
        # read version, no reads, no atomic operands; one write; at least rv + 1;
        # no clears; one set; no deletes, no adds.
        args = (rv, None, None, None, None, None, [key], [key + b"\x00"], rv + 1)
        args += (None, None, [key], [value], None, None, None)
        row = run(old.commit, args).fetchone()
    return int(row[0])
