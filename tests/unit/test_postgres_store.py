"""The postgresql:// store's own promises: its tables live in the schema the URL names,
quick creates them, and a schema quick does not recognise is refused and left untouched.
(The KV contract suites and every suite over the ``backend`` fixture run on it too.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quickzones.client import Quick
from quickzones.errors import InvalidStoreURL, NotAQuickStore, StoreNotFound
from quickzones.store.admin import zone_count
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.postgres import SESSION, postgres_store_url
from tests.waiting import returns_within, wait_for

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


@pytest.fixture
def admin() -> Iterator[object]:
    import psycopg

    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        yield conn


def _schema(name: str) -> str:
    return f"{SESSION}_{name}"


def _tables(admin: object, schema: str) -> set[str]:
    rows = admin.execute(  # type: ignore[attr-defined]
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    return {name for (name,) in rows}


def test_quick_creates_its_tables_in_the_named_schema(admin: object) -> None:
    schema = _schema("made")
    q = Quick.open(postgres_store_url(schema))
    item = q.enqueue("job", {"n": 1}, app="a", tenant="t1")
    q.close()
    assert _tables(admin, schema) == {"kv", "quick_meta", "quick_log"}
    options = admin.execute(  # type: ignore[attr-defined]
        "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = 'kv'",
        (schema,),
    ).fetchone()
    assert "fillfactor=80" in options[0]  # backends/postgres/tuning.py
    again = Quick.open(postgres_store_url(schema), create=False)  # reopens, writes nothing
    assert again.status("a", "t1", item) is not None
    again.close()


def test_a_foreign_schema_is_refused_untouched(admin: object) -> None:
    schema = _schema("app")
    admin.execute(f'CREATE SCHEMA "{schema}"')  # type: ignore[attr-defined]
    admin.execute(f'CREATE TABLE "{schema}".orders (id int PRIMARY KEY)')  # type: ignore[attr-defined]
    admin.execute(f'INSERT INTO "{schema}".orders VALUES (7)')  # type: ignore[attr-defined]
    with pytest.raises(NotAQuickStore, match="left untouched"):
        Quick.open(postgres_store_url(schema))
    assert _tables(admin, schema) == {"orders"}
    rows = admin.execute(f'SELECT id FROM "{schema}".orders').fetchall()  # type: ignore[attr-defined]
    assert rows == [(7,)]


def test_a_schema_with_a_foreign_quick_meta_is_refused(admin: object) -> None:
    schema = _schema("lookalike")
    admin.execute(f'CREATE SCHEMA "{schema}"')  # type: ignore[attr-defined]
    for table in ("kv", "quick_conflicts"):
        admin.execute(f'CREATE TABLE "{schema}".{table} (id int)')  # type: ignore[attr-defined]
    admin.execute(f'CREATE TABLE "{schema}".quick_meta (id int)')  # type: ignore[attr-defined]
    with pytest.raises(NotAQuickStore, match="quick_meta"):
        Quick.open(postgres_store_url(schema))


def test_a_newer_layout_is_refused(admin: object) -> None:
    schema = _schema("newer")
    Quick.open(postgres_store_url(schema)).close()
    admin.execute(f'UPDATE "{schema}".quick_meta SET format_version = 99')  # type: ignore[attr-defined]
    with pytest.raises(NotAQuickStore, match="newer"):
        Quick.open(postgres_store_url(schema))


def test_read_only_open_of_a_missing_schema_creates_nothing(admin: object) -> None:
    schema = _schema("absent")
    with pytest.raises(StoreNotFound):
        Quick.open(postgres_store_url(schema), create=False)
    found = admin.execute(  # type: ignore[attr-defined]
        "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
    ).fetchone()
    assert found is None


def test_bad_url_options_are_named() -> None:
    url = postgres_store_url(_schema("opts"))
    with pytest.raises(InvalidStoreURL, match="lock_timeout_ms"):
        Quick.open(url + "&lock_timeout_ms=soon")
    with pytest.raises(InvalidStoreURL, match="schema"):
        Quick.open(url.split("?")[0] + "?schema=" + "x" * 64)


def test_versionstamps_follow_commit_order_across_store_objects() -> None:
    """Commit-ordered versionstamps, which PostgreSQL has no native form of: 4 threads on
    2 store objects (separate connection pools, as two processes) each read a counter,
    bump it and write a versionstamped key holding the new count; the conflicts order the
    commits, and the stamps must sort in that same order."""
    import struct
    import threading

    from quickzones.backends.postgres import PostgresStore
    from quickzones.store.kv import KVTransaction, run

    url = postgres_store_url(_schema("stamps"))
    stores = [PostgresStore.from_url(url), PostgresStore.from_url(url)]
    log = b"log/"

    def bump(tr: KVTransaction) -> None:
        n = int(tr.get(b"count") or b"0") + 1
        tr.set(b"count", b"%d" % n)
        tr.set_versionstamped_key(log + b"\x00" * 10 + struct.pack("<I", len(log)), b"%d" % n)

    def worker(k: int) -> None:
        for _ in range(15):
            run(stores[k % 2], bump)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = run(stores[0], lambda tr: tr.get_range(log, log + b"\xff"))
    for store in stores:
        store.close()
    assert [int(v) for _, v in rows] == list(range(1, 61))  # key (stamp) order = commit order


def test_the_cli_reads_and_writes_a_postgres_store() -> None:
    from click.testing import CliRunner

    from quickzones.cli import main

    url = postgres_store_url(_schema("cli"))
    missing = CliRunner().invoke(main, ["--store", url, "stats"])
    assert missing.exit_code == 2 and "does not exist" in missing.output  # reads create nothing
    made = CliRunner().invoke(
        main, ["--store", url, "enqueue", "--job-type", "job", "--app", "a", "--tenant", "t"]
    )
    assert made.exit_code == 0, made.output
    stats = CliRunner().invoke(main, ["--store", url, "stats"])
    assert stats.exit_code == 0 and "t" in stats.output


def test_errors_never_show_the_password() -> None:
    url = postgres_store_url(_schema("secret")).replace("postgres@", "postgres:hunter2@", 1)
    with pytest.raises(StoreNotFound) as caught:
        Quick.open(url, create=False)
    assert "hunter2" not in str(caught.value) and ":***@" in str(caught.value)


def test_a_forked_child_leaves_the_parents_connections_alone() -> None:
    """A child that inherits an open store (a forking worker pool) and closes it must not
    end the parent's sessions on the sockets they share."""
    import os

    q = Quick.open(postgres_store_url(_schema("fork")))
    q.enqueue("job", {}, app="a", tenant="t")  # the pool now holds a connection
    pooled = q.kv._pool[-1]  # type: ignore[attr-defined]
    pid = os.fork()
    if pid == 0:
        try:
            q.close()
            child = Quick.open(q.kv.url)  # the child opens its own
            child.enqueue("job", {}, app="a", tenant="t")
            child.close()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert pooled.execute("SELECT 1").fetchone() == (1,)  # the parent's session is alive
    q.enqueue("job", {}, app="a", tenant="t")
    assert zone_count(q, q.zone("a", "t")) == 3
    q.close()


def _commit_round_trips(store: object, work: object) -> int:
    """Round trips of one transaction's commit (libpq's trace: one ReadyForQuery each) on
    the pooled connection the transaction takes; ``work(tr)`` reads and writes first."""
    import tempfile

    from quickzones.backends.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    conn = store._acquire()
    store._release(conn)  # the pool's only connection: the next transaction takes it
    tr = store.create_transaction()
    work(tr)  # type: ignore[operator]
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        tr.commit()
        conn.pgconn.untrace()
        trace.seek(0)
        return sum("\tB\t" in line and "ReadyForQuery" in line for line in trace)


def test_a_commit_holds_the_resolvers_lock_for_one_round_trip_at_most() -> None:
    """Every commit is serialised by the resolver's lock, so the time it holds it is the
    store's commit rate (issue 30's noisy neighbour: managers' commits queue behind it).
    The check, the writes and COMMIT go out in one round trip, so the lock never waits on
    the client (its CPU, its GIL); the server applies adds itself, and a commit with other
    atomic operations or versionstamps reads their operands first, without the lock, in
    one round trip more."""
    from quickzones.backends.postgres.store import PostgresStore
    from quickzones.store.kv import pack_i64

    store = PostgresStore.from_url(postgres_store_url(_schema("trips")))
    try:

        def read_write(tr: object) -> None:
            tr.get(b"a")  # type: ignore[attr-defined]
            tr.set(b"a", b"1")  # type: ignore[attr-defined]

        def with_add(tr: object) -> None:
            read_write(tr)
            tr.add(b"n", pack_i64(1))  # type: ignore[attr-defined]

        def with_max(tr: object) -> None:
            read_write(tr)
            tr.max(b"m", pack_i64(7))  # type: ignore[attr-defined]

        def with_stamp(tr: object) -> None:
            read_write(tr)
            tr.set_versionstamped_value(b"v", bytes(10) + (0).to_bytes(4, "little"))  # type: ignore[attr-defined]

        trips = {
            "read-write": _commit_round_trips(store, read_write),
            "atomic add": _commit_round_trips(store, with_add),
            "atomic add again": _commit_round_trips(store, with_add),
            "atomic max": _commit_round_trips(store, with_max),
            "versionstamp": _commit_round_trips(store, with_stamp),
        }
        assert trips == {
            "read-write": 1,
            "atomic add": 1,
            "atomic add again": 1,
            "atomic max": 2,
            "versionstamp": 2,
        }
        tr = store.create_transaction()
        values = [tr.get(key) for key in (b"a", b"n", b"m")]  # type: ignore[attr-defined]
        assert values == [b"1", pack_i64(2), pack_i64(7)]
    finally:
        store.close()


def test_a_read_only_transaction_ends_without_waiting_and_holds_no_snapshot(
    admin: object,
) -> None:
    """A scan, a part two that finds its pointer vested, a status read: each is a
    read-only transaction, and waiting for its ROLLBACK's answer was one round trip of
    every pickup's path (issue 30 (b)). Its end sends ROLLBACK and waits for nothing; the
    server ends the snapshot at once (the connection is idle, not idle in transaction,
    so VACUUM is never held back by a pooled connection), and the next transaction on
    the connection reads the answer before its own statements and sees newer data."""
    import tempfile
    import time

    from quickzones.backends.postgres.store import PostgresStore

    store = PostgresStore.from_url(postgres_store_url(_schema("ro_end")))
    try:
        conn = store._acquire()
        store._release(conn)  # the pool's only connection: every transaction takes it
        pid = conn.info.backend_pid
        writer = store.create_transaction()
        writer.set(b"k", b"1")
        writer.commit()
        tr = store.create_transaction()
        assert tr.get(b"k") == b"1"
        with tempfile.TemporaryFile("w+") as trace:
            conn.pgconn.trace(trace.fileno())
            tr.commit()  # nothing written: the snapshot ends
            conn.pgconn.untrace()
            trace.seek(0)
            lines = trace.readlines()
        assert sum("\tB\t" in line and "ReadyForQuery" in line for line in lines) == 0
        assert any("\tF\t" in line and "ROLLBACK" in line for line in lines), lines
        deadline = time.monotonic() + 5
        state = None
        while time.monotonic() < deadline:
            (state,) = admin.execute(  # type: ignore[attr-defined]
                "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if state == "idle":
                break
            time.sleep(0.01)
        assert state == "idle"
        other = PostgresStore.from_url(postgres_store_url(_schema("ro_end")))
        try:
            w = other.create_transaction()
            w.set(b"k", b"2")
            w.commit()
        finally:
            other.close()
        again = store.create_transaction()
        assert again.get(b"k") == b"2"
        again.commit()
        assert store._acquire() is conn  # the same connection, answered and reused
    finally:
        store.close()


def test_an_enqueue_into_a_zone_seen_before_asks_the_server_only_what_it_must() -> None:
    """A small tenant's item is picked up only after both parts of its enqueue committed:
    part two pulls the zone's pointer (requeued to vest later when the last visit emptied
    the zone) to the item's vesting time (issue 30 (b): the noisy neighbour's small
    tenants). Part one is a read, its read version going out with it, and a commit, whose
    round trip also reads the index entry and the pointer record just after its COMMIT;
    part two starts from that read, in its snapshot (its commit is checked against it),
    and is a commit alone. 3 round trips (libpq's trace: the requests sent), with the
    pointer pulled; the item is then picked up at once. Part two read them again before
    (4 round trips: a many-tenant producer's usual enqueue, 1.67 ms against 0.75 for an
    enqueue into a zone whose pointer vests in time)."""
    from quickzones.backends.postgres.store import PostgresStore
    from tests.pg_round_trips import traced_round_trips

    q = Quick.open(postgres_store_url(_schema("enqueue_trips")))
    try:
        ran: list[object] = []
        q.job("j")(lambda payload, ctx: ran.append(payload))
        q.enqueue("j", {"n": 1}, app="a", tenant="small")
        assert q.run_until_idle() == 1  # the zone is empty: its pointer vests later now
        store = q.kv
        assert isinstance(store, PostgresStore)
        ids: list[str] = []
        round_trips = traced_round_trips(
            store, lambda: ids.append(q.enqueue("j", {"n": 2}, app="a", tenant="small"))
        )
        item_id = ids[0]
        pointer = q.toplevel.get_pointer(q.zone("a", "small"))
        item = q.get("a", "small", item_id)
        assert pointer is not None and item is not None
        assert pointer.vesting_ms <= item.vesting_ms  # pulled: the item is picked up now
        assert round_trips <= 3, round_trips
        assert q.run_until_idle() == 1 and ran == [{"n": 1}, {"n": 2}]
    finally:
        q.close()


def test_an_idle_watcher_hears_another_process_commit_before_its_tick() -> None:
    """An idle consumer or long poll waiting on PostgreSQL is woken by another process's
    enqueue when it commits (a NOTIFY in the statement of a commit that makes a zone's
    pointer vest earlier, delivered by its COMMIT), not at its next read of the commit
    counter: with a tick of a minute, the enqueue of another store object still wakes it
    (issue 30 (b): the tick's wait was half of it on every pickup). An application's own
    transaction notifies at its COMMIT, not before."""
    import threading

    import psycopg

    from quickzones.store.changes import watcher_for

    url = postgres_store_url(_schema("notified"))
    waiting, other = Quick.open(url), Quick.open(url)
    try:
        watcher = watcher_for(waiting.kv)
        assert watcher is not None
        woke = threading.Event()
        with watcher.watching(woke.set, watcher.version(), tick_s=60.0):
            other.enqueue("j", {}, app="a", tenant="t")
            assert woke.wait(10)
            while woke.wait(0.5):  # the enqueue's part two commits after its part one
                woke.clear()
            other.job("j")(lambda payload, ctx: None)
            assert other.run_until_idle() == 1
            assert not woke.wait(1.0)  # visits and completions wake no one
            with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
                with conn.transaction():
                    other.enqueue_on(conn, "j", {}, app="a", tenant="t2")
                    assert not woke.wait(1.0)  # nothing committed yet
                assert woke.wait(10)
    finally:
        waiting.close()
        other.close()


def test_a_store_that_stops_waiting_stops_listening(admin: object) -> None:
    """A listening session whose client reads nothing keeps the server's notification
    queue from being trimmed until every NOTIFY fails: the listening connection is read
    by a thread of its own while anyone waits, and closed after a while without a wait
    (``idle_s``)."""
    import time

    from quickzones.backends.postgres.notifications import CommitNotifications
    from quickzones.backends.postgres.sql import channel
    from quickzones.backends.postgres.store import PostgresStore

    store = PostgresStore.from_url(postgres_store_url(_schema("listen_idle")))
    listens = f'LISTEN "{channel(store.schema)}"'

    def listening() -> int:
        (n,) = admin.execute(  # type: ignore[attr-defined]
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s", (listens,)
        ).fetchone()
        return int(n)

    notifications = CommitNotifications(store._connect, store.schema, "mine", idle_s=0.3)
    try:
        notifications.wait(5.0)  # returns once listening
        assert listening() == 1
        deadline = time.monotonic() + 10
        while listening() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listening() == 0
        notifications.wait(5.0)  # a wait listens again
        assert listening() == 1
    finally:
        notifications.close()
        store.close()


def test_an_idle_listening_thread_wakes_only_at_its_slice_and_still_hears_at_once() -> None:
    """An idle worker costs next to nothing (issue 44 point 4): the thread reading the
    listening connection sleeps on its socket between notifications. psycopg's
    ``notifies(timeout=...)`` woke it every 100 ms (to look for Ctrl-C), ten wake-ups a
    second per idle process, the most of any thread of an idle PostgreSQL worker. Counted
    by the kernel (the thread's voluntary context switches), not timed: over 3 s of
    waits, at most a few (its ``SLICE_S`` look whether to stop, 2 s), against 30 before;
    and a NOTIFY still ends a wait."""
    import threading
    from pathlib import Path

    from quickzones.backends.postgres.notifications import CommitNotifications
    from quickzones.backends.postgres.store import PostgresStore

    if not Path("/proc/self/task").is_dir():
        pytest.skip("counts the kernel's context switches (/proc, Linux)")
    store = PostgresStore.from_url(postgres_store_url(_schema("listen_wakes")))
    other = PostgresStore.from_url(postgres_store_url(_schema("listen_wakes")))
    notifications = CommitNotifications(store._connect, store.schema, "mine")

    def switches() -> int:
        (reader,) = [t for t in threading.enumerate() if t.name == "quick-commit-notifications"]
        status = Path(f"/proc/self/task/{reader.native_id}/status").read_text()
        (line,) = [ln for ln in status.splitlines() if ln.startswith("voluntary_ctxt_switches")]
        return int(line.split()[1])

    try:
        notifications.wait(5.0)  # returns once listening
        assert wait_for(lambda: notifications.signalled)  # its probe heard
        before = switches()
        for _ in range(3):
            notifications.wait(1.0)  # nothing is committed: each waits its timeout
        woke = switches() - before
        other.notify_commit()
        returned = returns_within(30, lambda: notifications.wait(60.0))
    finally:
        notifications.close()
        other.close()
        store.close()
    assert returned is None
    assert woke <= 6, f"the idle listening thread woke {woke} times in 3 s"


def test_a_listener_that_cannot_connect_does_not_hammer_the_server() -> None:
    """No connection to spare (max_connections reached, a server restarting): the waits
    go on at the watcher's tick without a new connection attempt each time."""
    import time

    import psycopg

    from quickzones.backends.postgres.notifications import RETRY_S, CommitNotifications

    attempts = 0

    def refused() -> object:
        nonlocal attempts
        attempts += 1
        raise psycopg.OperationalError("too many clients already")

    notifications = CommitNotifications(refused, "s", "mine")  # type: ignore[arg-type]
    try:
        began = time.monotonic()
        while time.monotonic() - began < RETRY_S / 2:
            notifications.wait(0.005)
        assert attempts == 1
    finally:
        notifications.close()


def _store_with_one_item(schema: str) -> None:
    q = Quick.open(postgres_store_url(schema))
    q.enqueue("job", {"n": 1}, app="a", tenant="t1")
    q.close()


def _reopened_runs_both_items(schema: str) -> None:
    """Opened again (brought up to date), the store takes a second item and runs both."""
    q = Quick.open(postgres_store_url(schema))
    try:
        q.enqueue("job", {"n": 2}, app="a", tenant="t1")
        ran: list[int] = []

        @q.job("job")
        def job(payload: dict[str, int], ctx: object) -> None:
            ran.append(payload["n"])

        assert q.run_until_idle() == 2
        assert sorted(ran) == [1, 2]
    finally:
        q.close()


def test_a_layout_1_schema_is_migrated_keeping_its_items(admin: object) -> None:
    """A store quick made before the resolver moved into the server (layout 1: one
    encoded column of conflict ranges) opens as layout 3 with every item kept; the
    conflict table that layout's processes wrote in their commits is gone, so they fail."""
    from tests.pg_layout2_sql import make_layout_2

    schema = _schema("layout1")
    _store_with_one_item(schema)
    make_layout_2(admin, schema)
    s = f'"{schema}"'
    admin.execute(f"DROP TABLE {s}.quick_conflicts")  # type: ignore[attr-defined]
    admin.execute(f"DROP FUNCTION IF EXISTS {s}.quick_resolve")  # type: ignore[attr-defined]
    admin.execute(f"DROP FUNCTION IF EXISTS {s}.quick_commit")  # type: ignore[attr-defined]
    admin.execute(  # type: ignore[attr-defined]
        f"CREATE TABLE {s}.quick_conflicts (version bigint PRIMARY KEY, ranges bytea NOT NULL)"
    )
    admin.execute(f"UPDATE {s}.quick_meta SET format_version = 1")  # type: ignore[attr-defined]
    _reopened_runs_both_items(schema)
    row = admin.execute(f"SELECT format_version FROM {s}.quick_meta").fetchone()  # type: ignore[attr-defined]
    assert row == (3,)
    assert _tables(admin, schema) == {"kv", "quick_meta", "quick_log"}


def test_a_layout_2_schema_is_migrated_and_its_old_processes_refused(admin: object) -> None:
    """A store the previous release made (layout 2: every commit serialised on the
    quick_meta row) opens as layout 3 with every item kept, and its commit versions go
    on from the last one. A process of that release still running commits under the old
    lock, which layout 3's commits do not take: its commits are refused with one line
    that names the cause and the fix, and nothing it sent is written."""
    import psycopg

    from tests.pg_layout2_sql import commit_as_layout_2, make_layout_2

    schema = _schema("layout2")
    _store_with_one_item(schema)
    make_layout_2(admin, schema)
    s = f'"{schema}"'
    with psycopg.connect(postgres_store_url(schema).split("?")[0], autocommit=True) as old:
        before = commit_as_layout_2(old, schema, b"old-process", b"1")  # works before
        _reopened_runs_both_items(schema)
        with pytest.raises(psycopg.Error, match="upgrade it") as refused:
            commit_as_layout_2(old, schema, b"old-process", b"2")
        assert "migrated to layout 3" in str(refused.value)
    row = admin.execute(f"SELECT format_version FROM {s}.quick_meta").fetchone()  # type: ignore[attr-defined]
    assert row == (3,)
    value = admin.execute(f"SELECT value FROM {s}.kv WHERE key = 'old-process'").fetchone()  # type: ignore[attr-defined]
    assert value is not None and bytes(value[0]) == b"1"
    (last,) = admin.execute(f"SELECT last_value FROM {s}.quick_versions").fetchone()  # type: ignore[attr-defined]
    assert last > before


def test_a_transactions_first_read_opens_its_snapshot_in_the_same_round_trip() -> None:
    """The read version (BEGIN, the version row) goes out with the first read: a
    transaction that reads one key is one round trip (two before; py-spy put a third of
    quick worker's waits on PostgreSQL in the separate read-version round trip)."""
    import tempfile

    from quickzones.backends.postgres.store import PostgresStore

    store = PostgresStore.from_url(postgres_store_url(_schema("first_read")))
    try:
        tr = store.create_transaction()
        tr.set(b"k", b"v")
        tr.commit()
        conn = store._acquire()
        store._release(conn)  # the pool's only connection: the next transaction takes it
        tr = store.create_transaction()
        with tempfile.TemporaryFile("w+") as trace:
            conn.pgconn.trace(trace.fileno())
            value = tr.get(b"k")
            conn.pgconn.untrace()
            trace.seek(0)
            trips = sum("\tB\t" in line and "ReadyForQuery" in line for line in trace)
        assert (value, trips) == (b"v", 1)
        assert tr.get_read_version() >= 1
        fresh = store.create_transaction()
        assert fresh.get_read_version() == tr.get_read_version()  # before any read too
    finally:
        store.close()
