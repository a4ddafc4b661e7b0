"""The PostgreSQL backend's schema and statements, each for one named schema.

``kv.key`` is ``bytea``: PostgreSQL compares bytea with memcmp (then length), so keys sort
exactly as in FoundationDB. ``quick_meta`` holds the last commit version (its row lock
serialises commits: the resolver) and the layout's name and version (what makes a schema
quick's); ``quick_conflicts`` holds each recent commit's write conflict ranges, as two
arrays (begins, ends) the server itself compares; ``quick_resolve`` is the resolver's
check and version bump, run by the server so that the lock is held only while the server
works, never across a round trip to the client (layout 2; layout 1 kept the ranges in one
encoded column the client decoded, under the lock).
"""

from __future__ import annotations

import functools

# What quick_meta.format holds in a schema quick made; FORMAT_VERSION is this code's
# layout (a newer one is refused, an older one migrated by _MIGRATIONS).
FORMAT = "quickzones-kv"
FORMAT_VERSION = 2
QUICK_TABLES = frozenset({"kv", "quick_meta", "quick_conflicts"})
# Conflict ranges covering every key a transaction can read (system keys are refused),
# as quick_conflicts' two arrays.
EVERY_KEY: tuple[list[bytes], list[bytes]] = ([b""], [b"\xff"])
# The SQLSTATEs quick_resolve raises: a read conflicts with a newer commit (FDB's 1020);
# the values a commit computed its writes from (atomic operands, the versionstamp) moved
# before it took the lock, so it computes them again (never seen by a caller).
CONFLICT_STATE = "QK020"
MOVED_STATE = "QK021"
KEYS_PER_SELECT = 1000


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def channel(schema: str) -> str:
    """The schema's NOTIFY channel (an identifier: at most 63 bytes), on which each
    commit notifies (backends/postgres/notifications.py)."""
    return f"quick:{schema}".encode()[:63].decode(errors="ignore")


class Statements:
    """Every statement the backend runs, qualified by its schema (each text built once,
    on first use: they are on every transaction's path)."""

    def __init__(self, schema: str, sender: str = "") -> None:
        self.schema = schema
        # Who commits (a store object's token): the payload of its commits' NOTIFY, so
        # its own listener passes over them (backends/postgres/notifications.py).
        self.sender = sender

    def _t(self, table: str) -> str:
        return f"{quote_ident(self.schema)}.{table}"

    @functools.cached_property
    def create(self) -> tuple[str, ...]:
        s = quote_ident(self.schema)
        return (
            f"CREATE SCHEMA IF NOT EXISTS {s}",
            f"CREATE TABLE {s}.kv (key bytea PRIMARY KEY, value bytea NOT NULL)",
            f"CREATE TABLE {s}.quick_meta (id int PRIMARY KEY CHECK (id = 0),"
            " version bigint NOT NULL, format text NOT NULL, format_version int NOT NULL)",
            f"INSERT INTO {s}.quick_meta VALUES (0, 0, '{FORMAT}', {FORMAT_VERSION})",
            *self.conflicts_layout,
        )

    @functools.cached_property
    def conflicts_layout(self) -> tuple[str, ...]:
        """quick_conflicts and quick_resolve as layout 2 has them (created, or migrated
        from layout 1 by replacing the table: its rows only matter for 5 s)."""
        s = quote_ident(self.schema)
        overlaps = (
            "EXISTS (SELECT 1 FROM {s}.quick_conflicts c, unnest(c.begins, c.ends) w(b, e),"
            " unnest({b}, {e}) r(b, e) WHERE c.version > {since} AND w.b < r.e AND r.b < w.e)"
        )
        reads = overlaps.format(s=s, b="p_rb", e="p_re", since="p_rv")
        moved = overlaps.format(s=s, b="p_ab", e="p_ae", since="p_since")
        return (
            f"CREATE TABLE {s}.quick_conflicts (version bigint PRIMARY KEY,"
            " begins bytea[] NOT NULL, ends bytea[] NOT NULL)",
            # The resolver: take the lock, fail a read that a newer commit wrote into
            # (p_rv: the read version, p_rb/p_re: the read conflict ranges), fail a
            # commit whose atomic operands (p_ab/p_ae, read at p_since) or versionstamp
            # (p_at_least) went stale meanwhile, record the write conflict ranges under
            # the new version and bump it. Returns the commit version.
            f"""CREATE OR REPLACE FUNCTION {s}.quick_resolve(p_rv bigint, p_rb bytea[],
    p_re bytea[], p_since bigint, p_ab bytea[], p_ae bytea[], p_wb bytea[], p_we bytea[],
    p_at_least bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    locked bigint;
    committed bigint;
BEGIN
    SELECT version INTO locked FROM {s}.quick_meta WHERE id = 0 FOR UPDATE;
    IF p_rv IS NOT NULL AND locked > p_rv AND cardinality(p_rb) > 0 AND {reads} THEN
        RAISE EXCEPTION 'a read conflicts with a later commit' USING ERRCODE = '{CONFLICT_STATE}';
    END IF;
    IF p_since IS NOT NULL AND (locked >= p_at_least
            OR (locked > p_since AND cardinality(p_ab) > 0 AND {moved})) THEN
        RAISE EXCEPTION 'the commit''s operands moved' USING ERRCODE = '{MOVED_STATE}';
    END IF;
    committed := greatest(locked + 1, p_at_least);
    INSERT INTO {s}.quick_conflicts (version, begins, ends) VALUES (committed, p_wb, p_we);
    UPDATE {s}.quick_meta SET version = committed WHERE id = 0;
    RETURN committed;
END $$""",
            *self.commit_function,
            # FoundationDB's atomic add (docs/fdb-semantics.md section 3): little-endian,
            # the stored value cut or zero-padded to the operand's width, modulo that
            # width; an absent value adds to zero. Applied by the server, so an add
            # needs no read of the value before the commit.
            f"""CREATE OR REPLACE FUNCTION {s}.quick_add(p_old bytea, p_add bytea)
    RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    result bytea := p_add;
    carry int := 0;
    total int;
BEGIN
    FOR i IN 0 .. length(p_add) - 1 LOOP
        total := get_byte(p_add, i) + carry;
        IF p_old IS NOT NULL AND i < length(p_old) THEN
            total := total + get_byte(p_old, i);
        END IF;
        result := set_byte(result, i, total % 256);
        carry := total / 256;
    END LOOP;
    RETURN result;
END $$""",
        )

    @functools.cached_property
    def commit_function(self) -> tuple[str, ...]:
        """``quick_commit``: a whole commit in one statement, the resolver's check and
        version bump (``quick_resolve``) then the writes in the order FoundationDB applies
        them (clears, sets, point deletes, adds), each kind as arrays: one statement to
        send, bind and run where a statement per written key was, so a commit costs the
        client and the server (which holds the lock meanwhile) less. Added to layout 2
        stores on opening; code that does not call it is unaffected."""
        s = quote_ident(self.schema)
        return (
            f"""CREATE OR REPLACE FUNCTION {s}.quick_commit(p_rv bigint, p_rb bytea[],
    p_re bytea[], p_since bigint, p_ab bytea[], p_ae bytea[], p_wb bytea[], p_we bytea[],
    p_at_least bigint, p_cb bytea[], p_ce bytea[], p_sk bytea[], p_sv bytea[],
    p_dk bytea[], p_ak bytea[], p_av bytea[]) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    committed bigint;
BEGIN
    committed := {s}.quick_resolve(p_rv, p_rb, p_re, p_since, p_ab, p_ae, p_wb, p_we,
        p_at_least);
    FOR i IN 1 .. coalesce(cardinality(p_cb), 0) LOOP
        DELETE FROM {s}.kv WHERE key >= p_cb[i] AND key < p_ce[i];
    END LOOP;
    IF cardinality(p_sk) > 0 THEN
        INSERT INTO {s}.kv (key, value) SELECT * FROM unnest(p_sk, p_sv)
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    END IF;
    IF cardinality(p_dk) > 0 THEN
        DELETE FROM {s}.kv WHERE key = ANY(p_dk);
    END IF;
    IF cardinality(p_ak) > 0 THEN
        INSERT INTO {s}.kv AS t (key, value) SELECT * FROM unnest(p_ak, p_av)
            ON CONFLICT (key) DO UPDATE SET value = {s}.quick_add(t.value, excluded.value);
    END IF;
    RETURN committed;
END $$""",
        )

    @functools.cached_property
    def commit(self) -> str:
        # Keys and ranges (bytea arrays) go in binary: psycopg's text form escapes each
        # element with a regular expression, most of a commit's client CPU.
        marks = "%s, %b, %b, %s, %b, %b, %b, %b, %s, %b, %b, %b, %b, %b, %b, %b"
        return f"SELECT {quote_ident(self.schema)}.quick_commit({marks})"

    @functools.cached_property
    def commit_waking(self) -> str:
        # A commit that made a zone's pointer vest earlier (kv.wake_watchers) notifies
        # with it, delivered when its transaction commits: watchers in other processes
        # wake at once (backends/postgres/notifications.py). Only those: every commit's
        # NOTIFY woke idle consumers for visits and completions they need not see.
        notify = f"pg_notify({quote_literal(channel(self.schema))}, {quote_literal(self.sender)})"
        return f"{self.commit}, {notify}"

    @functools.cached_property
    def has_commit_function(self) -> str:
        return f"SELECT to_regproc('{quote_ident(self.schema)}.quick_commit') IS NOT NULL"

    @functools.cached_property
    def migrate_from_1(self) -> tuple[str, ...]:
        """Layout 1 to 2 (under the schema lock and the resolver's): the new conflict
        table starts with one row that conflicts with every read older than now."""
        s = quote_ident(self.schema)
        return (
            f"SELECT version FROM {s}.quick_meta WHERE id = 0 FOR UPDATE",
            f"DROP TABLE {s}.quick_conflicts",
            *self.conflicts_layout,
            f"INSERT INTO {s}.quick_conflicts SELECT version, ARRAY[''::bytea],"
            f" ARRAY['\\xff'::bytea] FROM {s}.quick_meta WHERE id = 0",
            f"UPDATE {s}.quick_meta SET format_version = 2 WHERE id = 0",
        )

    @functools.cached_property
    def version_and_values(self) -> str:
        # One statement, so one snapshot: the values are exactly those of that version.
        return (
            f"SELECT m.version, k.key, k.value FROM {self._t('quick_meta')} m"
            f" LEFT JOIN {self._t('kv')} k ON k.key = ANY(%b) WHERE m.id = 0"
        )

    @functools.cached_property
    def version(self) -> str:
        return f"SELECT version FROM {self._t('quick_meta')} WHERE id = 0"

    @functools.cached_property
    def versions_after(self) -> str:
        # The commits after a version (the commit counter: whose they were).
        return f"SELECT version FROM {self._t('quick_conflicts')} WHERE version > %s"

    @functools.cached_property
    def lock_version(self) -> str:
        # The resolver's lock: one commit at a time holds this row until it ends.
        return f"SELECT version FROM {self._t('quick_meta')} WHERE id = 0 FOR UPDATE"

    @functools.cached_property
    def join_lock(self) -> str:
        # The resolver's lock taken by an application's transaction, and which transaction
        # that is (locking a row gives it an id): see PostgresStore.check_not_held_here.
        return (
            f"SELECT version, pg_current_xact_id()::text FROM {self._t('quick_meta')}"
            " WHERE id = 0 FOR UPDATE"
        )

    @functools.cached_property
    def meta(self) -> str:
        return f"SELECT format, format_version FROM {self._t('quick_meta')} WHERE id = 0"

    @functools.cached_property
    def get(self) -> str:
        return f"SELECT value FROM {self._t('kv')} WHERE key = %b"

    @functools.cached_property
    def get_many(self) -> str:
        return f"SELECT key, value FROM {self._t('kv')} WHERE key = ANY(%b)"

    @functools.cached_property
    def range(self) -> str:
        return f"SELECT key, value FROM {self._t('kv')} WHERE key >= %b AND key < %b ORDER BY key"

    @functools.cached_property
    def range_reverse(self) -> str:
        return (
            f"SELECT key, value FROM {self._t('kv')} WHERE key >= %b AND key < %b ORDER BY key DESC"
        )

    @functools.cached_property
    def record_conflicts(self) -> str:
        table = self._t("quick_conflicts")
        return f"INSERT INTO {table} (version, begins, ends) VALUES (%s, %b, %b)"

    @functools.cached_property
    def bump_version(self) -> str:
        return f"UPDATE {self._t('quick_meta')} SET version = %s WHERE id = 0"

    @functools.cached_property
    def prune_conflicts(self) -> str:
        return f"DELETE FROM {self._t('quick_conflicts')} WHERE version < %s"

    @functools.cached_property
    def newest_before(self) -> str:
        return f"SELECT max(version) FROM {self._t('quick_conflicts')} WHERE version < %s"

    @functools.cached_property
    def everything(self) -> str:
        return f"SELECT key, value FROM {self._t('kv')} ORDER BY key"


TABLES_IN_SCHEMA = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
SCHEMA_EXISTS = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
