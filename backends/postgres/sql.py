"""The PostgreSQL backend's schema and statements, each for one named schema.

``kv.key`` is ``bytea``: PostgreSQL compares bytea with memcmp (then length), so keys sort
exactly as in FoundationDB. ``quick_meta`` holds the layout's name and version (what makes
a schema quick's); ``quick_log`` holds each recent commit's write conflict ranges with the
id of the PostgreSQL transaction that made it, as two arrays (begins, ends) the server
itself compares; ``quick_versions`` numbers commits. ``quick_commit3`` is a whole commit,
run by the server: it takes the commit's advisory locks (``locks.py``: only commits that
touch the same keys wait for each other), fails a read that a commit its snapshot did not
see wrote into, records the write ranges and applies the writes (layout 3, issue 42;
layouts 1 and 2 serialised every commit on the ``quick_meta`` row).
"""

from __future__ import annotations

import functools
import re

from psycopg import sql as pgsql

from quickzones.backends.postgres.tuning import schema_statements

# What quick_meta.format holds in a schema quick made; FORMAT_VERSION is this code's
# layout (a newer one is refused, an older one migrated: migrate_to_3).
FORMAT = "quickzones-kv"
FORMAT_VERSION = 3
# The tables every layout has (quick_conflicts: layouts 1 and 2; quick_log: layout 3).
QUICK_TABLES = frozenset({"kv", "quick_meta"})
# The SQLSTATEs quick_commit3 raises: a read conflicts with a commit its snapshot did not
# see (FDB's 1020); the values a commit computed its writes from (atomic operands) were
# written by a commit their read did not see, so it computes them again (never seen by a
# caller); a process of an older quick committing into a store this one migrated.
CONFLICT_STATE = "QK020"
MOVED_STATE = "QK021"
UPGRADED_STATE = "QK030"
UPGRADED = (
    "this quick store was migrated to layout 3 (no global commit lock) by a newer"
    " quickzones; this process's quickzones can no longer commit to it: stop it and upgrade"
    " it (pip install -U quickzones)"
)
KEYS_PER_SELECT = 1000
# A parameter's mark in a statement's template (psycopg's: text or binary).
_MARK = re.compile(r"%[sb]")
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

    def __init__(self, schema: str, sender: str = "", lock_timeout_ms: int = 10_000) -> None:
        self.schema = schema
        # What a commit waits at most for another's locks (quick_commit3 sets it for
        # itself: a session's setting does not follow it through PgBouncer).
        self.lock_timeout = f"{int(lock_timeout_ms)}ms"
        # Who commits (a store object's token): the payload of its commits' NOTIFY, so
        # its own listener passes over them (backends/postgres/notifications.py).
        self.sender = sender

    def _q(self, template: str) -> str:
        """``template`` with ``{s}`` the schema and ``{kv}``, ``{meta}``, ``{log}``, ...
        its tables and functions, as quoted identifiers."""
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
            "commit3": pgsql.Identifier(s, "quick_commit3"),
            "ensure3": pgsql.Identifier(s, "quick_ensure3"),
            "pull3": pgsql.Identifier(s, "quick_pull3"),
            "log": pgsql.Identifier(s, "quick_log"),
            "seq": pgsql.Identifier(s, "quick_versions"),
            # nextval() and setval() take the sequence's name as text, quoted within it.
            "seq_name": pgsql.Literal(pgsql.Identifier(s, "quick_versions").as_string()),
            "upgraded": pgsql.Literal(UPGRADED),
            "upgraded_state": pgsql.Literal(UPGRADED_STATE),
            "format": pgsql.Literal(FORMAT),
            "format_version": pgsql.Literal(FORMAT_VERSION),
            "conflict_state": pgsql.Literal(CONFLICT_STATE),
            "moved_state": pgsql.Literal(MOVED_STATE),
        }

    def _function(self, head: str, body: str) -> str:
        return _function(head, body, **self._names)

    def _wire(self, template: str) -> bytes:
        """``template`` for :mod:`.wire`: its ``%s``/``%b`` marks numbered ``$1``, ``$2``...
        in order (before the names are composed in, so a name's own ``%`` stays)."""
        count = iter(range(1, 1000))
        return self._q(_MARK.sub(lambda _: f"${next(count)}", template)).encode()

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
            # version: what layouts 1 and 2 serialised commits on; kept (never bumped) so
            # that a process of an older quick reads it and fails only at its commit.
            self._q(
                "CREATE TABLE {meta} (id int PRIMARY KEY CHECK (id = 0),"
                " version bigint NOT NULL, format text NOT NULL, format_version int NOT NULL)"
            ),
            self._q("INSERT INTO {meta} VALUES (0, 0, {format}, {format_version})"),
            self._q("CREATE SEQUENCE {seq}"),
            self._q("SELECT nextval({seq_name})"),
            *self.layout_3,
            *schema_statements(self.schema),
        )

    @functools.cached_property
    def layout_3(self) -> tuple[str, ...]:
        """quick_log and the functions of layout 3 (created, or added by the migration)."""
        # The rows of the commits a snapshot did not see: those of transactions at or
        # past its xmax, and those of the ones it saw running; two index scans (on xid),
        # never a scan of the whole log.
        unseen = (
            "EXISTS (SELECT 1 FROM (SELECT begins, ends FROM {{log}}"
            " WHERE xid >= pg_snapshot_xmax({snap}) AND xid <> me UNION ALL"
            " SELECT begins, ends FROM {{log}} WHERE xid = ANY(ARRAY("
            "SELECT pg_snapshot_xip({snap}))) AND xid <> me) c,"
            " unnest(c.begins, c.ends) w(b, e), unnest({b}, {e}) r(b, e)"
            " WHERE w.b < r.e AND r.b < w.e)"
        )
        reads = unseen.format(b="p_rb", e="p_re", snap="p_snap")
        moved = unseen.format(b="p_ab", e="p_ae", snap="p_since")
        return (
            # xid: the transaction that committed the row (or will: an application's
            # transaction writes it at its enqueue and commits it at its COMMIT), so a
            # reader's snapshot says whether it saw that commit; at: the clock (us).
            self._q(
                "CREATE TABLE {log} (id bigint PRIMARY KEY, xid xid8 NOT NULL,"
                " at bigint NOT NULL, begins bytea[] NOT NULL, ends bytea[] NOT NULL)"
            ),
            self._q("CREATE INDEX ON {log} (xid)"),
            # A commit: its advisory locks (sorted, so never a cycle of waits; held until
            # its transaction ends), the check of what it read (p_snap: the snapshot its
            # reads saw; a commit that snapshot did not see and whose written ranges meet
            # a read range fails it), the check of its atomic operands (read at p_since),
            # its row in quick_log and its writes, in the order FoundationDB applies them
            # (clears, sets, point deletes, adds). Returns the commit version.
            self._function(
                """CREATE OR REPLACE FUNCTION {commit3}(p_snap pg_snapshot, p_rb bytea[],
    p_re bytea[], p_space int, p_locks int[], p_x bool[], p_since pg_snapshot, p_ab bytea[],
    p_ae bytea[], p_wb bytea[], p_we bytea[], p_version bigint, p_at bigint, p_cb bytea[],
    p_ce bytea[], p_sk bytea[], p_sv bytea[], p_dk bytea[], p_ak bytea[], p_av bytea[],
    p_lock_timeout text) RETURNS bigint LANGUAGE plpgsql""",
                f"""
DECLARE
    committed bigint;
    me xid8 := pg_current_xact_id();
    was text := current_setting('lock_timeout');
BEGIN
    -- The store's lock_timeout for this commit's waits only, whatever server session
    -- runs it (behind PgBouncer a session setting lands on any) and whatever the
    -- application's transaction it may run in has set.
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    -- One statement for all the locks (a statement each cost most of a commit's time
    -- in the server), taken in the array's order: sorted by the client.
    PERFORM count(*) FROM (SELECT CASE WHEN t.x THEN pg_advisory_xact_lock(p_space, t.l)
            ELSE pg_advisory_xact_lock_shared(p_space, t.l) END
        FROM unnest(p_locks, p_x) WITH ORDINALITY AS t(l, x, o) ORDER BY t.o) taken;
    IF p_snap IS NOT NULL AND cardinality(p_rb) > 0 AND {reads} THEN
        RAISE EXCEPTION 'a read conflicts with a later commit' USING ERRCODE = {{conflict_state}};
    END IF;
    IF p_since IS NOT NULL AND cardinality(p_ab) > 0 AND {moved} THEN
        RAISE EXCEPTION 'the commit''s operands moved' USING ERRCODE = {{moved_state}};
    END IF;
    committed := coalesce(p_version, nextval({{seq_name}}));
    IF cardinality(p_wb) > 0 THEN
        INSERT INTO {{log}} (id, xid, at, begins, ends) VALUES (committed, me, p_at, p_wb, p_we);
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_cb), 0) LOOP
        DELETE FROM {{kv}} WHERE key >= p_cb[i] AND key < p_ce[i];
    END LOOP;
    IF cardinality(p_sk) > 0 THEN
        INSERT INTO {{kv}} (key, value) SELECT * FROM unnest(p_sk, p_sv)
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    END IF;
    IF cardinality(p_dk) > 0 THEN
        DELETE FROM {{kv}} WHERE key = ANY(p_dk);
    END IF;
    IF cardinality(p_ak) > 0 THEN
        INSERT INTO {{kv}} AS t (key, value) SELECT * FROM unnest(p_ak, p_av)
            ON CONFLICT (key) DO UPDATE SET value = {{add}}(t.value, excluded.value);
    END IF;
    PERFORM set_config('lock_timeout', was, true);
    RETURN committed;
END """,
            ),
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
            *self.ensure_function,
            *self.pull_function,
        )

    @functools.cached_property
    def ensure_function_exists(self) -> str:
        name = pgsql.Identifier(self.schema, "quick_ensure3").as_string()
        signature = f"{name}(bytea[], int[], bytea[], bytea[], bytea[], bytea[], text, text)"
        return compose(
            "SELECT to_regprocedure({signature}) IS NOT NULL", signature=pgsql.Literal(signature)
        )

    @functools.cached_property
    def pull_function_exists(self) -> str:
        name = pgsql.Identifier(self.schema, "quick_pull3").as_string()
        signature = (
            f"{name}(bytea[], bytea[], bytea[], bytea[], bigint[], bytea[], bytea[], bytea[],"
            " bytea[], text, text)"
        )
        return compose(
            "SELECT to_regprocedure({signature}) IS NOT NULL", signature=pgsql.Literal(signature)
        )

    @functools.cached_property
    def pull_function(self) -> tuple[str, ...]:
        """quick_pull3 (part of layout 3, added on opening to a store made before it):
        the enqueue's part two made by the server in its part one's commit, after
        quick_ensure3 (``kv.EarlierIfLater``, ``resolver.Guard.earlier``)."""
        return (
            # Run under the locks quick_commit3 took (each record key's exclusive: every
            # commit that moves a pointer's vesting entry writes its record, so none comes
            # between), each statement reading the newest committed state. Where the index
            # entry still names the pointer (p_iv) and its record is that pointer's, idle
            # (p_head: the map's header, id, app, tenant) with a vesting time later than
            # the item's (p_limit), the record becomes p_rec and its vesting entry moves
            # from the old time (packed as fdb.tuple packs an integer) to p_ne; the three
            # keys join the commit's row in quick_log (only then: an enqueue into a zone
            # whose pointer a consumer holds or that vests in time conflicts with nobody).
            # Anything else is left to part two's own transaction. Returns how many moved.
            self._function(
                """CREATE OR REPLACE FUNCTION {pull3}(p_ik bytea[], p_iv bytea[],
    p_rk bytea[], p_head bytea[], p_limit bigint[], p_rec bytea[], p_eh bytea[], p_et bytea[],
    p_ne bytea[], p_channel text, p_payload text) RETURNS int LANGUAGE plpgsql""",
                """
DECLARE
    rec bytea;
    hl int;
    raw bytea;
    old bigint;
    n int;
    old_key bytea;
    moved int := 0;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ik), 0) LOOP
        CONTINUE WHEN (SELECT value FROM {kv} WHERE key = p_ik[i]) IS DISTINCT FROM p_iv[i];
        rec := (SELECT value FROM {kv} WHERE key = p_rk[i]);
        hl := length(p_head[i]);
        CONTINUE WHEN rec IS NULL OR length(rec) < hl + 9
            OR substring(rec FROM 1 FOR hl) <> p_head[i] OR get_byte(rec, hl) <> 207;
        raw := substring(rec FROM hl + 2 FOR 8);
        old := ('x' || encode(raw, 'hex'))::bit(64)::bigint;
        CONTINUE WHEN old <= p_limit[i];
        n := 8;
        WHILE n > 0 AND get_byte(raw, 8 - n) = 0 LOOP
            n := n - 1;
        END LOOP;
        old_key := p_eh[i] || set_byte('\\x00'::bytea, 0, 20 + n)
            || substring(raw FROM 9 - n FOR n) || p_et[i];
        UPDATE {kv} SET value = p_rec[i] WHERE key = p_rk[i];
        DELETE FROM {kv} WHERE key = old_key;
        INSERT INTO {kv} (key, value) VALUES (p_ne[i], '')
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
        UPDATE {log} SET begins = begins || ARRAY[p_rk[i], old_key, p_ne[i]],
            ends = ends || ARRAY[p_rk[i] || '\\x00'::bytea, old_key || '\\x00'::bytea,
                p_ne[i] || '\\x00'::bytea]
            WHERE xid = pg_current_xact_id();
        moved := moved + 1;
    END LOOP;
    IF moved > 0 AND p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, p_payload);
    END IF;
    RETURN moved;
END """,
            ),
        )

    @functools.cached_property
    def ensure_function(self) -> tuple[str, ...]:
        """quick_ensure3 (part of layout 3, added on opening to a store made before it):
        an enqueue's pointer made by the server where its zone has none, in the commit's
        transaction after quick_commit3 (``resolver.Guard``)."""
        return (
            # Run under the locks quick_commit3 took (the guard key's and those of the
            # writes exclusive, the expected keys' shared), so what it reads is the newest
            # committed state and no commit touching those keys comes between. Expected
            # values (the cluster's layout, NULL: absent) that moved fail the commit as a
            # read conflict does, and the client reads them afresh. One call for every
            # guard of a commit (a transaction enqueueing into many zones). p_channel:
            # NOTIFY it (with p_payload, delivered at COMMIT) where it writes
            # (kv.wake_watchers).
            self._function(
                """CREATE OR REPLACE FUNCTION {ensure3}(p_gk bytea[], p_gi int[],
    p_sk bytea[], p_sv bytea[], p_ek bytea[], p_ev bytea[], p_channel text, p_payload text)
    RETURNS void LANGUAGE plpgsql""",
                """
DECLARE
    wrote bool := false;
BEGIN
    -- A key at a time: a join of the arrays with the table was planned as a scan of it.
    FOR i IN 1 .. coalesce(cardinality(p_ek), 0) LOOP
        IF (SELECT value FROM {kv} WHERE key = p_ek[i]) IS DISTINCT FROM p_ev[i] THEN
            RAISE EXCEPTION 'a value the commit expected has moved'
                USING ERRCODE = {conflict_state};
        END IF;
    END LOOP;
    -- Guard i's writes are those whose p_gi is i.
    FOR i IN 1 .. coalesce(cardinality(p_gk), 0) LOOP
        IF NOT EXISTS (SELECT 1 FROM {kv} WHERE key = p_gk[i]) THEN
            INSERT INTO {kv} (key, value) SELECT w.k, w.v FROM unnest(p_sk, p_sv, p_gi) w(k, v, g)
                WHERE w.g = i ON CONFLICT (key) DO UPDATE SET value = excluded.value;
            wrote := true;
        END IF;
    END LOOP;
    IF wrote AND p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, p_payload);
    END IF;
END """,
            ),
        )

    @functools.cached_property
    def refuse_older_commits(self) -> tuple[str, ...]:
        """Layout 2's commit functions replaced by ones that refuse, naming the cause: a
        process of an older quick still running when a newer one migrated the store would
        otherwise commit under the old lock, which layout 3's commits no longer take."""
        refuse = "BEGIN RAISE EXCEPTION {upgraded} USING ERRCODE = {upgraded_state}; END"
        return (
            self._function(
                """CREATE OR REPLACE FUNCTION {resolve}(p_rv bigint, p_rb bytea[],
    p_re bytea[], p_since bigint, p_ab bytea[], p_ae bytea[], p_wb bytea[], p_we bytea[],
    p_at_least bigint) RETURNS bigint LANGUAGE plpgsql""",
                refuse,
            ),
            self._function(
                """CREATE OR REPLACE FUNCTION {commit}(p_rv bigint, p_rb bytea[],
    p_re bytea[], p_since bigint, p_ab bytea[], p_ae bytea[], p_wb bytea[], p_we bytea[],
    p_at_least bigint, p_cb bytea[], p_ce bytea[], p_sk bytea[], p_sv bytea[],
    p_dk bytea[], p_ak bytea[], p_av bytea[]) RETURNS bigint LANGUAGE plpgsql""",
                refuse,
            ),
        )

    @functools.cached_property
    def migrate_to_3(self) -> tuple[str, ...]:
        """Layout 1 or 2 to 3 (under the schema lock). The quick_meta row's lock waits
        for the commits of older processes under way and keeps new ones out until the
        migration commits; from then on their commits are refused (refuse_older_commits;
        layout 1 wrote quick_conflicts itself, so that table goes: its commits fail).
        The commit versions go on from the last one."""
        return (
            self._q("SELECT version FROM {meta} WHERE id = 0 FOR UPDATE"),
            self._q("CREATE SEQUENCE {seq}"),
            self._q("SELECT setval({seq_name}, (SELECT version + 1 FROM {meta} WHERE id = 0))"),
            *self.layout_3,
            *schema_statements(self.schema),
            *self.refuse_older_commits,
            self._q("UPDATE {meta} SET format_version = {format_version} WHERE id = 0"),
        )

    @functools.cached_property
    def retire_conflicts(self) -> dict[int, str]:
        """What happens to quick_conflicts, by the layout migrated from: layout 2's
        processes read it in their commit watcher, so it stays, empty; layout 1's wrote
        it in their commits, which must fail, so it goes."""
        return {1: self._q("DROP TABLE {conflicts}"), 2: self._q("TRUNCATE {conflicts}")}

    @functools.cached_property
    def read_version(self) -> str:
        # The first statement of a snapshot: the snapshot itself (what the commit's check
        # compares quick_log's transactions with) and the last commit version taken.
        return self._q("SELECT pg_current_snapshot()::text, (SELECT last_value FROM {seq})")

    @functools.cached_property
    def snapshot_and_values(self) -> str:
        # Before a commit with atomic operations other than adds or a versionstamp: the
        # current values of its atomic keys, the snapshot they were read in, and its commit
        # version (the stamp is made from it), in one statement.
        return self._q(
            "SELECT s.snap, s.v, k.key, k.value FROM (SELECT pg_current_snapshot()::text,"
            " nextval({seq_name})) s(snap, v) LEFT JOIN {kv} k ON k.key = ANY(%b)"
        )

    @functools.cached_property
    def version(self) -> str:
        return self._q("SELECT last_value FROM {seq}")

    # The commits a snapshot (the parameter) did not see and this statement's does, and
    # this statement's snapshot (the commit counter, PostgresStore.data_version).
    _COMMITS_UNSEEN = (
        "SELECT pg_current_snapshot()::text, array(SELECT id FROM {log}"
        " WHERE xid >= pg_snapshot_xmax(%s::pg_snapshot) UNION ALL SELECT id FROM {log}"
        " WHERE xid = ANY(ARRAY(SELECT pg_snapshot_xip(%s::pg_snapshot))))"
    )

    @functools.cached_property
    def native_commit(self) -> str:
        """A native SQL zones' commit that wakes watchers (native.signal_commit): its row in
        the log, with no ranges, and the schema's NOTIFY; returns the row's id."""
        return self._q(
            "WITH c AS (INSERT INTO {log} (id, xid, at, begins, ends) VALUES"
            " (nextval({seq_name}), pg_current_xact_id(), 0, '{{}}', '{{}}') RETURNING id)"
            " SELECT c.id, pg_notify(%s, %s) FROM c"
        )

    @functools.cached_property
    def commits_unseen(self) -> str:
        """:data:`_COMMITS_UNSEEN` for psycopg (bench.pg_long_txn times it)."""
        return self._q(self._COMMITS_UNSEEN)

    # The status of application transactions (after_commit.py), by their ids as text.
    XACT_STATUS = "SELECT x, pg_xact_status(x::xid8) FROM unnest(%s::text[]) x"
    # Waits for the commits in flight that hold one of these locks exclusively (taken
    # shared, in the array's order as commits take theirs, so never a cycle of waits; held
    # until the implicit transaction of the statements sent with it ends).
    SETTLE = (
        "SELECT count(*) FROM (SELECT pg_advisory_xact_lock_shared(%s::int, t.l)"
        " FROM unnest(%s::int[]) WITH ORDINALITY AS t(l, o) ORDER BY t.o) held"
    )

    @functools.cached_property
    def snapshot_now(self) -> str:
        return "SELECT pg_current_snapshot()::text"

    @functools.cached_property
    def logged_commit(self) -> str:
        # A commit whose answer was lost, found by what it wrote into its log row: the
        # client's clock (us) and its write conflict ranges, which name the keys it wrote
        # (an enqueue's new item among them), first in the row (quick_pull3 adds the keys
        # it wrote after them). Read only then: a scan of a few seconds of rows.
        return self._q(
            "SELECT id FROM {log} WHERE at = %s AND begins[1:%s] = %s::bytea[]"
            " AND ends[1:%s] = %s::bytea[]"
        )

    @functools.cached_property
    def prune_log(self) -> str:
        # Rows of commits a snapshot taken over 6 s ago saw: every transaction that can
        # still commit read after that snapshot (5 s lifetime), so it sees them too.
        return self._q(
            "DELETE FROM {log} WHERE id IN (SELECT id FROM {log}"
            " WHERE xid < pg_snapshot_xmax(%s::pg_snapshot)"
            " AND pg_visible_in_snapshot(xid, %s::pg_snapshot) FOR UPDATE SKIP LOCKED)"
        )

    @functools.cached_property
    def application_xact(self) -> str:
        # An application's transaction, as quick's first read of a try through it: its id
        # (assigned now if it had none), the snapshot that read sees (at READ COMMITTED
        # each statement takes a newer one: the check is only the more careful), its
        # isolation level and the last commit version (the read version).
        return self._q(
            "SELECT pg_current_xact_id()::text, pg_current_snapshot()::text,"
            " current_setting('transaction_isolation'), (SELECT last_value FROM {seq})"
        )

    @functools.cached_property
    def meta(self) -> str:
        return self._q("SELECT format, format_version FROM {meta} WHERE id = 0")

    # Each read and the commit in two spellings of one text: psycopg's marks (an
    # application's asyncio connection) and wire's numbered ones (wire.py: quick's own
    # connections and an application's blocking psycopg connection).
    _GET = "SELECT value FROM {kv} WHERE key = %b"
    _GET_MANY = "SELECT key, value FROM {kv} WHERE key = ANY(%b)"
    # The keys' values with the snapshot they were read in and the last commit version
    # (backends/postgres/known_reads.py), one row a key found, one with NULLs if none.
    _SEEN_MANY = (
        "SELECT s.snap, s.v, k.key, k.value FROM (SELECT pg_current_snapshot()::text,"
        " (SELECT last_value FROM {seq})) s(snap, v) LEFT JOIN {kv} k ON k.key = ANY(%b)"
    )
    # After a commit with one guard (resolver.Guard): _SEEN_MANY of the keys, the guard's
    # key among them, and of the key its value names (a prefix, the value, a suffix: the
    # zone's pointer record). Cheap to plan: a statement of every enqueue.
    _SEEN_FOLLOWING = (
        "SELECT s.snap, s.v, k.key, k.value FROM (SELECT pg_current_snapshot()::text,"
        " (SELECT last_value FROM {seq})) s(snap, v) LEFT JOIN {kv} k ON k.key = ANY("
        "array_append(%b::bytea[], %b || (SELECT value FROM {kv} WHERE key = %b) || %b))"
    )
    # With several (a transaction enqueueing into many zones): each guard key whose value
    # is not the one its guard wrote (the zone had a pointer), with the key it names. Its
    # planning (about 0.5 ms) is paid once for all of them.
    _SEEN_FOLLOWING_MANY = (
        "SELECT s.snap, s.v, k.key, k.value FROM (SELECT pg_current_snapshot()::text,"
        " (SELECT last_value FROM {seq})) s(snap, v) LEFT JOIN {kv} k ON k.key = ANY("
        "%b::bytea[] || ARRAY(SELECT x.key FROM unnest(%b::bytea[], %b::bytea[], %b::bytea[],"
        " %b::bytea[]) g(key, mine, before, after) JOIN {kv} t ON t.key = g.key"
        " AND t.value <> g.mine, LATERAL (VALUES (g.key), (g.before || t.value || g.after))"
        " x(key)))"
    )
    _ENSURE = "SELECT {ensure3}(%b, %b, %b, %b, %b, %b, %s::text, %s::text)"
    _PULL = "SELECT {pull3}(%b, %b, %b, %b, %b, %b, %b, %b, %b, %s::text, %s::text)"
    _RANGE = "SELECT key, value FROM {kv} WHERE key >= %b AND key < %b ORDER BY key"
    _LIMIT = " LIMIT %s"
    # Keys and ranges (bytea arrays) go in binary: psycopg's text form escapes each
    # element with a regular expression, most of a commit's client CPU.
    _COMMIT = (
        "SELECT {commit3}(%s::pg_snapshot, %b, %b, %s::int, %s::int[], %s::bool[],"
        " %s::pg_snapshot, %b, %b, %b, %b, %s::bigint, %s::bigint, %b, %b, %b, %b, %b, %b, %b,"
        " %s::text)"
    )
    # A commit that made a zone's pointer vest earlier (kv.wake_watchers) notifies with
    # it, delivered when its transaction commits: watchers in other processes wake at
    # once (backends/postgres/notifications.py). Only those: every commit's NOTIFY woke
    # idle consumers for visits and completions they need not see. The channel and the
    # payload are two more parameters (notify_args).
    _WAKING = ", pg_notify(%s::text, %s::text)"

    @functools.cached_property
    def get(self) -> str:
        return self._q(self._GET)

    @functools.cached_property
    def get_many(self) -> str:
        return self._q(self._GET_MANY)

    @functools.cached_property
    def range(self) -> str:
        return self._q(self._RANGE)

    @functools.cached_property
    def range_reverse(self) -> str:
        return self._q(self._RANGE + " DESC")

    @functools.cached_property
    def commit(self) -> str:
        return self._q(self._COMMIT)

    @functools.cached_property
    def commit_waking(self) -> str:
        return self._q(self._COMMIT + self._WAKING)

    @functools.cached_property
    def wire(self) -> dict[str, bytes]:
        """The same statements for :mod:`.wire` (``range`` with its LIMIT)."""
        return {
            "read_version": self.read_version.encode(),
            "get": self._wire(self._GET),
            "get_many": self._wire(self._GET_MANY),
            "seen_many": self._wire(self._SEEN_MANY),
            "seen_following": self._wire(self._SEEN_FOLLOWING),
            "seen_following_many": self._wire(self._SEEN_FOLLOWING_MANY),
            "ensure": self._wire(self._ENSURE),
            "pull": self._wire(self._PULL),
            "range": self._wire(self._RANGE + self._LIMIT),
            "range_reverse": self._wire(self._RANGE + " DESC" + self._LIMIT),
            "commit": self._wire(self._COMMIT),
            "commit_waking": self._wire(self._COMMIT + self._WAKING),
            "commits_unseen": self._wire(self._COMMITS_UNSEEN),
            "xact_status": self._wire(self.XACT_STATUS),
            "settle": self._wire(self.SETTLE),
        }

    @functools.cached_property
    def notify_args(self) -> tuple[str, str]:
        """The parameters ``commit_waking`` takes after ``commit``'s."""
        return (channel(self.schema), self.sender)

    @functools.cached_property
    def everything(self) -> str:
        return self._q("SELECT key, value FROM {kv} ORDER BY key")


TABLES_IN_SCHEMA = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
# The schema (absent: no row), whether the URL's role may use it, and who and where that is.
SCHEMA_ACCESS = (
    "SELECT has_schema_privilege(oid, 'USAGE'), current_user, current_database()"
    " FROM pg_namespace WHERE nspname = %s"
)
