"""Enqueue in the application's own PostgreSQL transaction (issue 30 point 2): an app whose
tables live in the store's database enqueues through its own connection (psycopg,
SQLAlchemy), at READ COMMITTED or SERIALIZABLE, and its row and the item commit together
or not at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.errors import ConfigurationError
from quickzones.registry import JobContext
from quickzones.store.admin import zone_count
from quickzones.store.kv import KVError
from quickzones.store.records import ZoneId
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import SESSION, postgres_store_url
from tests.waiting import returns_within, wait_for

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")

ISOLATIONS = ["read committed", "serializable"]


@pytest.fixture(params=["kv", "sql"])
def url(request: pytest.FixtureRequest) -> str:
    """A store in each zone layout: the KV one and zones=sql (items and pointers in
    tables of their own, the application's enqueue a statement of its transaction)."""
    return postgres_store_url() + ("&zones=sql" if request.param == "sql" else "")


@pytest.fixture()
def q(url: str) -> Iterator[Quick]:
    quick = Quick.open(url)
    yield quick
    quick.close()


def _server(url: str) -> str:
    return url.split("?")[0]


def _table(url: str) -> str:
    """The app's table, in the store's schema (beside quick's tables)."""
    schema = url.split("schema=")[1].split("&")[0]
    return f'"{schema}".orders'


@pytest.fixture()
def orders(url: str, q: Quick) -> str:
    with psycopg.connect(_server(url), autocommit=True) as c:
        c.execute(f"CREATE TABLE {_table(url)} (id int PRIMARY KEY, what text)")
    return _table(url)


def _rows(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(_server(url), autocommit=True) as c:
        return c.execute(f"SELECT id, what FROM {table} ORDER BY id").fetchall()


def _record_runs(q: Quick) -> list[object]:
    runs: list[object] = []

    @q.job("ship")
    def ship(payload: object, ctx: JobContext) -> None:
        runs.append(payload)

    return runs


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_app_row_and_item_commit_together(q: Quick, url: str, orders: str, isolation: str) -> None:
    runs = _record_runs(q)
    with psycopg.connect(_server(url)) as conn:  # psycopg's default: a transaction opens
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        conn.execute(f"INSERT INTO {orders} VALUES (1, 'book')")
        item_id = q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
        assert _rows(url, orders) == [] and q.get("shop", "t1", item_id) is None
        conn.commit()
    assert _rows(url, orders) == [(1, "book")]
    assert q.get("shop", "t1", item_id) is not None
    assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is not None
    assert q.run_until_idle() == 1 and runs == [{"order": 1}]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_rollback_leaves_neither_row_nor_item_nor_pointer(
    q: Quick, url: str, orders: str, isolation: str
) -> None:
    before = q.kv.snapshot_items()  # type: ignore[attr-defined]
    with psycopg.connect(_server(url)) as conn, pytest.raises(RuntimeError), conn.transaction():
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        conn.execute(f"INSERT INTO {orders} VALUES (1, 'book')")
        q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
        raise RuntimeError("payment declined")
    assert _rows(url, orders) == []
    zone = ZoneId("shop", "t1")
    if "zones=sql" in url:
        # Nothing of the item. At READ COMMITTED its zone's pointer was parked outside
        # the application's transaction (so other enqueuers of the zone never wait for
        # it): an empty zone's pointer, vesting later, which consumers collect.
        assert q.items.count(zone) == 0
        pointer = q.toplevel.get_pointer(zone)
        if isolation == "serializable":
            assert pointer is None  # made inside the application's transaction
        else:
            assert pointer is not None and pointer.vesting_ms > time.time() * 1000
    else:
        assert q.kv.snapshot_items() == before  # type: ignore[attr-defined]
        assert q.toplevel.get_pointer(zone) is None
    assert q.run_until_idle() == 0


def test_second_enqueue_into_an_idle_zone_pulls_its_pointer_earlier(q: Quick, url: str) -> None:
    """Part two (the pointer's vesting pulled earlier) follows the application's COMMIT."""
    runs = _record_runs(q)
    q.enqueue("ship", {"late": True}, app="shop", tenant="t1", delay=3600)
    pointer = q.toplevel.get_pointer(ZoneId("shop", "t1"))
    assert pointer is not None
    with psycopg.connect(_server(url)) as conn, conn.transaction():
        q.enqueue_on(conn, "ship", {"now": True}, app="shop", tenant="t1")
        time.sleep(0.2)
        before_commit = q.toplevel.get_pointer(ZoneId("shop", "t1"))
    # Part two runs once the application committed, in a transaction of its own: the
    # application never holds the pointer record consumers lease.
    assert before_commit == pointer

    def pulled() -> bool:
        after = q.toplevel.get_pointer(ZoneId("shop", "t1"))
        return after is not None and after.vesting_ms < pointer.vesting_ms

    assert wait_for(pulled, 10)
    assert q.run_until_idle() == 1 and runs == [{"now": True}]


def test_serializable_snapshot_older_than_a_quick_commit_is_a_retryable_conflict(
    q: Quick, url: str, orders: str
) -> None:
    runs = _record_runs(q)
    with psycopg.connect(_server(url)) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        conn.execute(f"SELECT count(*) FROM {orders}")  # the snapshot is taken here
        # A quick commit after it into another zone touches nothing the enqueue reads.
        q.enqueue("ship", {"other": True}, app="shop", tenant="t2")
        q.enqueue_on(conn, "ship", {"first": True}, app="shop", tenant="t4")
        conn.rollback()
        conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        conn.execute(f"SELECT count(*) FROM {orders}")
        # One into the same zone made the pointer the application's snapshot does not see.
        q.enqueue("ship", {"other": True}, app="shop", tenant="t1")
        with pytest.raises(KVError) as caught:
            q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
        assert caught.value.retryable
        conn.rollback()
        with conn.transaction():  # the app's retry succeeds
            conn.execute(f"INSERT INTO {orders} VALUES (1, 'book')")
            q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
    assert q.run_until_idle() == 3 and {"order": 1} in runs
    assert {"first": True} not in runs  # rolled back with the application


def test_sqlalchemy_connection_and_session(q: Quick, url: str, orders: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    runs = _record_runs(q)
    engine = sqlalchemy.create_engine(
        _server(url).replace("postgresql://", "postgresql+psycopg://")
    )
    try:
        with engine.begin() as c:
            c.execute(sqlalchemy.text(f"INSERT INTO {orders} VALUES (1, 'core')"))
            q.enqueue_on(c, "ship", {"order": 1}, app="shop", tenant="t1")
        with Session(engine) as session, session.begin():
            session.execute(sqlalchemy.text(f"INSERT INTO {orders} VALUES (2, 'orm')"))
            q.enqueue_on(session, "ship", {"order": 2}, app="shop", tenant="t1")
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            session.execute(sqlalchemy.text(f"INSERT INTO {orders} VALUES (3, 'orm')"))
            q.enqueue_on(session, "ship", {"order": 3}, app="shop", tenant="t1")
            raise RuntimeError("declined")
    finally:
        engine.dispose()
    assert _rows(url, orders) == [(1, "core"), (2, "orm")]
    assert q.run_until_idle() == 2 and sorted(p["order"] for p in runs) == [1, 2]  # type: ignore[index]


def test_autocommit_and_another_database_are_refused(q: Quick, url: str) -> None:
    with psycopg.connect(_server(url), autocommit=True) as conn:
        with pytest.raises(ConfigurationError, match="autocommit"):
            q.enqueue_on(conn, "ship", {}, app="shop", tenant="t1")
        name = f"{SESSION}_other"
        conn.execute(f'CREATE DATABASE "{name}"')
    other = _server(url).rsplit("/", 1)[0] + f"/{name}"
    try:
        with psycopg.connect(other) as conn, pytest.raises(ConfigurationError, match="database"):
            q.enqueue_on(conn, "ship", {}, app="shop", tenant="t1")
    finally:
        with psycopg.connect(_server(url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}"')
    assert q.run_until_idle() == 0


# --- real processes: producers committing and rolling back, consumers collecting --------

PRODUCER = textwrap.dedent(
    """
    import os, sys, psycopg
    from quickzones.client import Quick

    url, table, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    isolation = sys.argv[5]
    q = Quick.open(url)
    committed = []
    with psycopg.connect(url.split("?")[0]) as conn:
        n = first
        while n < first + count:
            try:
                with conn.transaction():
                    conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                    conn.execute(f"INSERT INTO {table} VALUES (%s, 'new')", (n,))
                    q.enqueue_on(conn, "ship", {"order": n}, app="shop", tenant=f"t{n % 5}")
                    if n % 3 == 0:
                        raise RuntimeError("declined")
                committed.append(n)
            except RuntimeError:
                pass
            except Exception as err:  # a serialization failure: the app retries
                if getattr(err, "retryable", False) or "serializ" in str(err):
                    continue
                raise
            n += 1
    print(" ".join(map(str, committed)))
    """
)

WORKER_APP = textwrap.dedent(
    """
    import os, psycopg
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_STORE"])

    @q.job("ship")
    def ship(payload, ctx):
        with open(os.environ["RUN_LOG"], "a") as log:
            log.write(f"{payload['order']}\\n")
    """
)


def test_producer_and_consumer_processes_strand_and_lose_nothing(
    url: str, orders: str, tmp_path: Any
) -> None:
    """4 producer processes (READ COMMITTED and SERIALIZABLE) commit and roll back app
    transactions with an enqueue each, into 5 tenants whose zones empty and refill, while
    2 worker processes drain them and collect empty zones' pointers: every committed item
    runs, no rolled-back one, and nothing is left in a zone without its pointer."""
    (tmp_path / "shopapp.py").write_text(WORKER_APP)
    (tmp_path / "producer.py").write_text(PRODUCER)
    run_log = tmp_path / "runs.log"
    env = {**os.environ, "QUICK_STORE": url, "RUN_LOG": str(run_log)}
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "shopapp:q"]
    workers = [subprocess.Popen(cmd, cwd=tmp_path, env=env) for _ in range(2)]
    try:
        producers = [
            subprocess.Popen(
                [sys.executable, "producer.py", url, orders, str(k * 1000), "40", iso],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for k, iso in enumerate(ISOLATIONS * 2)
        ]
        committed: list[int] = []
        for p in producers:
            out, _ = p.communicate(timeout=180)
            assert p.returncode == 0
            committed += [int(n) for n in out.split()]
        deadline = time.monotonic() + 90
        ran: list[int] = []
        while time.monotonic() < deadline:
            ran = [int(n) for n in run_log.read_text().split()] if run_log.exists() else []
            if set(ran) >= set(committed):
                break
            time.sleep(0.1)
        assert all(w.poll() is None for w in workers)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
    every = [k * 1000 + n for k in range(4) for n in range(40)]
    assert sorted(committed) == [n for n in every if n % 3]  # each app retried to the end
    assert sorted(set(ran)) == sorted(committed)  # none lost, none rolled back ran
    assert [r[0] for r in _rows(url, orders)] == sorted(committed)
    q = Quick.open(url)
    try:
        # Nothing stranded: no item is left in any zone (one without a pointer would be).
        assert [zone_count(q, ZoneId("shop", f"t{t}")) for t in range(5)] == [0] * 5
    finally:
        q.close()


DJANGO_APP = textwrap.dedent(
    """
    import sys
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    url, table = sys.argv[1], sys.argv[2]
    server = urlsplit(url)
    settings.configure(
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": server.path.lstrip("/"),
            "USER": server.username, "HOST": server.hostname, "PORT": server.port,
        }},
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection, transaction

    from quickzones.client import Quick
    from quickzones.errors import UnusableConnection

    q = Quick.open(url)
    try:  # outside atomic(), Django runs in autocommit: refused
        q.enqueue_on(connection, "ship", {"order": 0}, app="shop", tenant="t1")
        sys.exit("autocommit was not refused")
    except UnusableConnection as err:
        assert "autocommit" in str(err), err
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (5, 'django')")
        q.enqueue_on(connection, "ship", {"order": 5}, app="shop", tenant="t1")
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(f"INSERT INTO {table} VALUES (6, 'django')")
            q.enqueue_on(connection, "ship", {"order": 6}, app="shop", tenant="t1")
            raise RuntimeError("declined")
    except RuntimeError:
        pass
    """
)


def test_django_connection_inside_atomic(q: Quick, url: str, orders: str, tmp_path: Any) -> None:
    pytest.importorskip("django")
    script = tmp_path / "django_app.py"
    script.write_text(DJANGO_APP)
    proc = subprocess.run(
        [sys.executable, str(script), url, orders], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = _record_runs(q)
    assert _rows(url, orders) == [(5, "django")]
    assert q.run_until_idle() == 1 and runs == [{"order": 5}]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_async_connection_through_async_quick(url: str, orders: str, isolation: str) -> None:
    import asyncio

    from quickzones.aio import AsyncQuick

    async def app() -> tuple[str, str]:
        aq = AsyncQuick.open(url)
        try:
            async with await psycopg.AsyncConnection.connect(_server(url)) as conn:
                async with conn.transaction():
                    await conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                    await conn.execute(f"INSERT INTO {orders} VALUES (1, 'async')")
                    kept = await aq.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
                with pytest.raises(RuntimeError):
                    async with conn.transaction():
                        await conn.execute(f"INSERT INTO {orders} VALUES (2, 'async')")
                        dropped = await aq.enqueue_on(
                            conn, "ship", {"order": 2}, app="shop", tenant="t1"
                        )
                        raise RuntimeError("declined")
            return kept, dropped
        finally:
            await aq.aclose()

    kept, dropped = asyncio.run(app())
    q = Quick.open(url)
    try:
        runs = _record_runs(q)
        assert _rows(url, orders) == [(1, "async")]
        assert q.get("shop", "t1", kept) is not None and q.get("shop", "t1", dropped) is None
        assert q.run_until_idle() == 1 and runs == [{"order": 1}]
    finally:
        q.close()


def test_an_enqueue_on_a_connection_seen_before_asks_the_server_only_what_it_must(
    url: str, q: Quick, orders: str
) -> None:
    """Each round trip to the server is time added to the application's transaction
    (issue 30's target: at most 1 ms at the median, bench/postgres_peer.py). Once the
    connection is known to reach the store's database, an enqueue into a zone this
    process enqueued into before is 2 round trips: the resolver's lock with part one's
    reads and the zone's pointer record (part two joins part one: nothing else commits
    while the lock is held, so the record is read with the index entry, under the id
    this process last saw), and the commit (one pipeline: its savepoint, the server's
    resolver and writes, the savepoint's release). 3 when the id is not known or went
    stale (the record read after the index), 5 before part two joined, 6 before the
    resolver ran in the server. libpq's own trace counts them: one ReadyForQuery per
    round trip."""
    import tempfile

    runs = _record_runs(q)
    with psycopg.connect(_server(url), autocommit=True) as conn:
        with conn.transaction():
            q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
        with tempfile.TemporaryFile("w+") as trace, conn.transaction():
            conn.execute(f"INSERT INTO {orders} VALUES (2, 'book')")
            conn.pgconn.trace(trace.fileno())
            q.enqueue_on(conn, "ship", {"order": 2}, app="shop", tenant="t1")
            conn.pgconn.untrace()
            trace.seek(0)
            round_trips = sum("\tB\t" in line and "ReadyForQuery" in line for line in trace)
    assert round_trips <= 2, round_trips
    assert [row[0] for row in _rows(url, orders)] == [2]
    assert q.run_until_idle() == 2
    assert sorted(r["order"] for r in runs) == [1, 2]  # type: ignore[index]


def test_quick_calls_inside_the_open_app_transaction_never_wait_for_it(
    url: str, orders: str
) -> None:
    """From an ``enqueue_on`` until the application's COMMIT, its transaction holds the
    store's commit lock. A quick call in that same thread that commits on its own could
    only wait for its own thread: a status read (whose steady clock publishes its time,
    a commit, once a second) used to wait 60 s; it returns at once, and a call that
    must commit on its own (``Quick.enqueue``) fails at once naming the cause."""
    from quickzones.errors import HeldByOwnTransaction

    if "zones=sql" in url:
        _native_calls_inside_the_open_app_transaction_never_wait_for_it(url, orders)
        return
    q = Quick.open(url + "&lock_timeout_ms=120000")  # the lock wait alone outlasts _within
    found: dict[str, Any] = {}

    def inside(item: str) -> None:
        found["inside"] = q.status("shop", "t1", item)
        try:
            q.enqueue("ship", {"order": 2}, app="shop", tenant="t1")
        except HeldByOwnTransaction as err:
            found["enqueue"] = err

    def after(item: str) -> None:
        found["after"] = q.status("shop", "t1", item)
        found["again"] = q.enqueue("ship", {"order": 3}, app="shop", tenant="t1")

    try:
        _in_one_thread(q, url, orders, inside, after)
    finally:
        q.close()
    assert found["inside"] is None  # not committed yet: no other transaction sees it
    assert "commit or roll back" in str(found["enqueue"])
    assert found["after"] is not None  # committed with the app's row
    assert found["again"]  # the lock went with the COMMIT


def _native_calls_inside_the_open_app_transaction_never_wait_for_it(url: str, orders: str) -> None:
    """zones=sql: the application's transaction holds its zone's pointer FOR KEY SHARE
    and its item's row, nothing a quick call of its own thread needs: a plain enqueue
    into the same zone commits at once (past the steady clock's next publication, which
    commits on its own), a read does not see the uncommitted item, and after the COMMIT
    both run."""
    q = Quick.open(url + "&lock_timeout_ms=120000")
    runs = _record_runs(q)
    found: dict[str, Any] = {}

    def inside(item: str) -> None:
        found["inside"] = q.get("shop", "t1", item)
        found["plain"] = q.enqueue("ship", {"order": 2}, app="shop", tenant="t1")

    def after(item: str) -> None:
        found["after"] = q.get("shop", "t1", item)

    try:
        _in_one_thread(q, url, orders, inside, after)
        assert found["inside"] is None  # not committed yet: no other transaction sees it
        assert found["plain"] and found["after"] is not None
        assert wait_for(lambda: q.run_until_idle() >= 0 and len(runs) == 2, 20), runs
    finally:
        q.close()


def _in_one_thread(
    q: Quick, url: str, orders: str, inside: Callable[[str], None], after: Callable[[str], None]
) -> None:
    """An application's transaction and quick's calls in one thread: INSERT, enqueue_on,
    past the steady clock's next publication (1 s), ``inside(item)``, COMMIT,
    ``after(item)``; all within 45 s."""

    def run() -> None:
        with psycopg.connect(_server(url), autocommit=True) as conn:
            with conn.transaction():
                conn.execute(f"INSERT INTO {orders} VALUES (1, 'book')")
                item = q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
                time.sleep(1.2)  # past the steady clock's 1 s between publications
                inside(item)
            after(item)

    returns_within(45, run)
