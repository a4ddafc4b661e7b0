"""The previous release's PostgreSQL layout (layout 2: every commit serialised on the
quick_meta row), frozen as it shipped, so tests can make a store of that layout and commit
into it as that release's processes did (issue 42 point 4: migration and rolling upgrade).
Never imported by quickzones itself."""

from __future__ import annotations

import functools

from psycopg import sql as pgsql

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
# PostgreSQL's longest name in bytes (NAMEDATALEN - 1); longer ones are cut silently.
MAX_IDENTIFIER_BYTES = 63


def compose(template: str, **parts: pgsql.Composable) -> str:
    """``template`` with each ``{name}`` replaced by a psycopg composable (an
    ``Identifier`` for a name, a ``Literal`` for a constant), rendered once as text: the
    only way a name reaches a statement here (issue 41 point 2). Values a caller chooses
    are parameters (``%s``/``%b``), never text."""
    return pgsql.SQL(template).format(**parts).as_string()


def check_schema_name(schema: str) -> str | None:
    """Why PostgreSQL cannot hold ``schema`` as an identifier, or None: it silently cuts
    a name to 63 bytes (so a longer one would name another schema than the URL's) and
    refuses NUL."""
    if not schema:
        return "must not be empty"
    if "\x00" in schema:
        return "contains a NUL character, which PostgreSQL refuses in names"
    size = len(schema.encode())
    if size > MAX_IDENTIFIER_BYTES:
        return (
            f"is {size} bytes in UTF-8, longer than PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte"
            " limit for names (it would silently cut it and name another schema)"
        )
    return None


def channel(schema: str) -> str:
    """The schema's NOTIFY channel (an identifier: at most 63 bytes), on which each
    commit notifies (backends/postgres/notifications.py)."""
    return f"quick:{schema}".encode()[:MAX_IDENTIFIER_BYTES].decode(errors="ignore")


def _function(head: str, body: str, **parts: pgsql.Composable) -> str:
    """``CREATE OR REPLACE FUNCTION`` with ``head`` (its signature and language) and
    ``body`` both composed from ``parts``; the body goes as a string literal, not between
    dollar quotes, which a name holding ``$$`` would end."""
    return compose(head + " AS {body}", **parts, body=pgsql.Literal(compose(body, **parts)))


class Statements:
    """Every statement the backend runs, qualified by its schema (each text built once,
    on first use: they are on every transaction's path)."""

    def __init__(self, schema: str, sender: str = "") -> None:
        self.schema = schema
        # Who commits (a store object's token): the payload of its commits' NOTIFY, so
        # its own listener passes over them (backends/postgres/notifications.py).
        self.sender = sender

    def _q(self, template: str) -> str:
        """``template`` with ``{s}`` the schema and ``{kv}``, ``{meta}``, ``{conflicts}``
        its tables, as quoted identifiers."""
        return compose(template, **self._names)

    @functools.cached_property
    def _names(self) -> dict[str, pgsql.Composable]:
        s = self.schema
        return {
            "s": pgsql.Identifier(s),
            "kv": pgsql.Identifier(s, "kv"),
            "meta": pgsql.Identifier(s, "quick_meta"),
            "conflicts": pgsql.Identifier(s, "quick_conflicts"),
            "resolve": pgsql.Identifier(s, "quick_resolve"),
            "commit": pgsql.Identifier(s, "quick_commit"),
            "add": pgsql.Identifier(s, "quick_add"),
            "format": pgsql.Literal(FORMAT),
            "format_version": pgsql.Literal(FORMAT_VERSION),
            "conflict_state": pgsql.Literal(CONFLICT_STATE),
            "moved_state": pgsql.Literal(MOVED_STATE),
        }

    def _function(self, head: str, body: str) -> str:
        return _function(head, body, **self._names)

    @functools.cached_property
    def create_schema(self) -> str:
        # Only run when the schema is absent: PostgreSQL checks the role may create
        # schemas in the database even when IF NOT EXISTS finds it.
        return self._q("CREATE SCHEMA IF NOT EXISTS {s}")

    @functools.cached_property
    def create(self) -> tuple[str, ...]:
        """quick's tables and functions in the (existing) schema."""
        return (
            self._q("CREATE TABLE {kv} (key bytea PRIMARY KEY, value bytea NOT NULL)"),
            self._q(
                "CREATE TABLE {meta} (id int PRIMARY KEY CHECK (id = 0),"
                " version bigint NOT NULL, format text NOT NULL, format_version int NOT NULL)"
            ),
            self._q("INSERT INTO {meta} VALUES (0, 0, {format}, {format_version})"),
            *self.conflicts_layout,
        )

    @functools.cached_property
    def conflicts_layout(self) -> tuple[str, ...]:
        """quick_conflicts and quick_resolve as layout 2 has them (created, or migrated
        from layout 1 by replacing the table: its rows only matter for 5 s)."""
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
            # The resolver: take the lock, fail a read that a newer commit wrote into
            # (p_rv: the read version, p_rb/p_re: the read conflict ranges), fail a
            # commit whose atomic operands (p_ab/p_ae, read at p_since) or versionstamp
            # (p_at_least) went stale meanwhile, record the write conflict ranges under
            # the new version and bump it. Returns the commit version.
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
            *self.commit_function,
            # FoundationDB's atomic add (docs/fdb-semantics.md section 3): little-endian,
            # the stored value cut or zero-padded to the operand's width, modulo that
            # width; an absent value adds to zero. Applied by the server, so an add
            # needs no read of the value before the commit.
            self._function(
                """CREATE OR REPLACE FUNCTION {add}(p_old bytea, p_add bytea)
    RETURNS bytea LANGUAGE plpgsql IMMUTABLE""",
                """
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
END """,
            ),
        )

    @functools.cached_property
    def commit_function(self) -> tuple[str, ...]:
        """``quick_commit``: a whole commit in one statement, the resolver's check and
        version bump (``quick_resolve``) then the writes in the order FoundationDB applies
        them (clears, sets, point deletes, adds), each kind as arrays: one statement to
        send, bind and run where a statement per written key was, so a commit costs the
        client and the server (which holds the lock meanwhile) less. Added to layout 2
        stores on opening; code that does not call it is unaffected."""
        return (
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
    def commit(self) -> str:
        # Keys and ranges (bytea arrays) go in binary: psycopg's text form escapes each
        # element with a regular expression, most of a commit's client CPU.
        marks = "%s, %b, %b, %s, %b, %b, %b, %b, %s, %b, %b, %b, %b, %b, %b, %b"
        return self._q(f"SELECT {{commit}}({marks})")

    @functools.cached_property
    def commit_waking(self) -> str:
        # A commit that made a zone's pointer vest earlier (kv.wake_watchers) notifies
        # with it, delivered when its transaction commits: watchers in other processes
        # wake at once (backends/postgres/notifications.py). Only those: every commit's
        # NOTIFY woke idle consumers for visits and completions they need not see.
        # The channel and the payload are two more parameters (notify_args).
        return f"{self.commit}, pg_notify(%s, %s)"

    @functools.cached_property
    def notify_args(self) -> tuple[str, str]:
        """The parameters ``commit_waking`` takes after ``commit``'s."""
        return (channel(self.schema), self.sender)

    @functools.cached_property
    def migrate_from_1(self) -> tuple[str, ...]:
        """Layout 1 to 2 (under the schema lock and the resolver's): the new conflict
        table starts with one row that conflicts with every read older than now."""
        return (
            self._q("SELECT version FROM {meta} WHERE id = 0 FOR UPDATE"),
            self._q("DROP TABLE {conflicts}"),
            *self.conflicts_layout,
            self._q(
                "INSERT INTO {conflicts} SELECT version, ARRAY[''::bytea],"
                " ARRAY['\\xff'::bytea] FROM {meta} WHERE id = 0"
            ),
            self._q("UPDATE {meta} SET format_version = 2 WHERE id = 0"),
        )

    @functools.cached_property
    def version_and_values(self) -> str:
        # One statement, so one snapshot: the values are exactly those of that version.
        return self._q(
            "SELECT m.version, k.key, k.value FROM {meta} m"
            " LEFT JOIN {kv} k ON k.key = ANY(%b) WHERE m.id = 0"
        )

    @functools.cached_property
    def version(self) -> str:
        return self._q("SELECT version FROM {meta} WHERE id = 0")

    @functools.cached_property
    def versions_after(self) -> str:
        # The commits after a version (the commit counter: whose they were).
        return self._q("SELECT version FROM {conflicts} WHERE version > %s")

    @functools.cached_property
    def lock_version(self) -> str:
        # The resolver's lock: one commit at a time holds this row until it ends.
        return self._q("SELECT version FROM {meta} WHERE id = 0 FOR UPDATE")

    @functools.cached_property
    def join_lock(self) -> str:
        # The resolver's lock taken by an application's transaction, and which transaction
        # that is (locking a row gives it an id): see PostgresStore.check_not_held_here.
        return self._q(
            "SELECT version, pg_current_xact_id()::text FROM {meta} WHERE id = 0 FOR UPDATE"
        )

    @functools.cached_property
    def meta(self) -> str:
        return self._q("SELECT format, format_version FROM {meta} WHERE id = 0")

    @functools.cached_property
    def get(self) -> str:
        return self._q("SELECT value FROM {kv} WHERE key = %b")

    @functools.cached_property
    def get_many(self) -> str:
        return self._q("SELECT key, value FROM {kv} WHERE key = ANY(%b)")

    @functools.cached_property
    def range(self) -> str:
        return self._q("SELECT key, value FROM {kv} WHERE key >= %b AND key < %b ORDER BY key")

    @functools.cached_property
    def range_reverse(self) -> str:
        return self._q("SELECT key, value FROM {kv} WHERE key >= %b AND key < %b ORDER BY key DESC")

    @functools.cached_property
    def record_conflicts(self) -> str:
        return self._q("INSERT INTO {conflicts} (version, begins, ends) VALUES (%s, %b, %b)")

    @functools.cached_property
    def bump_version(self) -> str:
        return self._q("UPDATE {meta} SET version = %s WHERE id = 0")

    @functools.cached_property
    def prune_conflicts(self) -> str:
        return self._q("DELETE FROM {conflicts} WHERE version < %s")

    @functools.cached_property
    def newest_before(self) -> str:
        return self._q("SELECT max(version) FROM {conflicts} WHERE version < %s")

    @functools.cached_property
    def everything(self) -> str:
        return self._q("SELECT key, value FROM {kv} ORDER BY key")


# Whether the schema named by the parameter has quick_commit (a layout 2 store made by
# an older quick has not): looked up by name, as a value, never parsed from text.
HAS_COMMIT_FUNCTION = (
    "SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    " WHERE n.nspname = %s AND p.proname = 'quick_commit')"
)
TABLES_IN_SCHEMA = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
# The schema (absent: no row), whether the URL's role may use it, and who and where that is.
SCHEMA_ACCESS = (
    "SELECT has_schema_privilege(oid, 'USAGE'), current_user, current_database()"
    " FROM pg_namespace WHERE nspname = %s"
)


def make_layout_2(admin: object, schema: str) -> None:
    """Turn the layout-3 store in ``schema`` into the layout-2 store the previous release
    would have made with the same items (``admin``: an autocommit psycopg connection)."""
    old = Statements(schema)
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
    old = Statements(schema)
    run = conn.execute  # type: ignore[attr-defined]
    with conn.transaction():  # type: ignore[attr-defined]
        (rv,) = run(old.version).fetchone()
        row = run(
            old.commit,
            (
                rv,
                None,
                None,
                None,
                None,
                None,
                [key],
                [key + b"\x00"],
                rv + 1,
                None,
                None,
                [key],
                [value],
                None,
                None,
                None,
            ),
        ).fetchone()
    return int(row[0])
