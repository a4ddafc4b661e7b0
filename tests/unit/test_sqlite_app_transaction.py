"""Enqueue in the application's own SQLite transaction (issue 15 point 6): an app that keeps
its tables in the store's SQLite file enqueues through its own connection, and its row and
the item commit together or not at all."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.errors import (
    ConfigurationError,
    InvalidArgument,
    StoreBusy,
    UnsupportedByStore,
)
from quickzones.registry import JobContext
from quickzones.store.kv import KVError, run
from quickzones.store.records import ZoneId


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return tmp_path / "app.db"


@pytest.fixture()
def q(db: Path) -> Iterator[Quick]:
    quick = Quick.open(f"sqlite:///{db}")
    yield quick
    quick.close()


@pytest.fixture()
def conn(db: Path, q: Quick) -> Iterator[sqlite3.Connection]:
    c = sqlite3.connect(db)  # the app's own connection, Python's default (deferred) mode
    c.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, what TEXT)")
    c.commit()
    yield c
    c.close()


def _orders(db: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as other:
        return other.execute("SELECT id, what FROM orders ORDER BY id").fetchall()


def _record_runs(q: Quick) -> list[object]:
    runs: list[object] = []

    @q.job("ship")
    def ship(payload: object, ctx: JobContext) -> None:
        runs.append(payload)

    return runs


def test_app_row_and_item_commit_together(q: Quick, conn: sqlite3.Connection, db: Path) -> None:
    runs = _record_runs(q)
    conn.execute("INSERT INTO orders (id, what) VALUES (1, 'book')")
    item_id = q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
    # Nothing is visible to anyone else before the app commits.
    assert _orders(db) == []
    assert q.get("shop", "t1", item_id) is None
    conn.commit()
    assert _orders(db) == [(1, "book")]
    assert q.get("shop", "t1", item_id) is not None
    assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is not None
    assert q.run_until_idle() == 1
    assert runs == [{"order": 1}]


def test_enqueue_before_the_apps_first_write_joins_the_same_transaction(
    q: Quick, conn: sqlite3.Connection, db: Path
) -> None:
    item_id = q.enqueue_on(conn, "ship", {"order": 2}, app="shop", tenant="t1")
    conn.execute("INSERT INTO orders (id, what) VALUES (2, 'pen')")
    conn.rollback()
    assert _orders(db) == []
    assert q.get("shop", "t1", item_id) is None


def test_rollback_leaves_neither_row_nor_item_nor_pointer(
    q: Quick, conn: sqlite3.Connection, db: Path
) -> None:
    before = q.kv.snapshot_items()  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError), conn:  # ``with conn`` rolls back on an exception
        conn.execute("INSERT INTO orders (id, what) VALUES (1, 'book')")
        q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1")
        raise RuntimeError("payment declined")
    assert _orders(db) == []
    assert q.kv.snapshot_items() == before  # type: ignore[attr-defined]
    assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is None
    assert q.run_until_idle() == 0


def test_with_conn_commits_both(q: Quick, conn: sqlite3.Connection, db: Path) -> None:
    runs = _record_runs(q)
    with conn:
        conn.execute("INSERT INTO orders (id, what) VALUES (3, 'lamp')")
        q.enqueue_on(conn, "ship", {"order": 3}, app="shop", tenant="t2", item_id="order-3")
    assert _orders(db) == [(3, "lamp")]
    assert q.run_until_idle() == 1 and runs == [{"order": 3}]


def test_second_enqueue_into_an_idle_zone_pulls_its_pointer_earlier(
    q: Quick, conn: sqlite3.Connection
) -> None:
    """Part two (the pointer's vesting pulled earlier) commits with the app too."""
    runs = _record_runs(q)
    q.enqueue("ship", {"late": True}, app="shop", tenant="t1", delay=3600)
    pointer = q.toplevel.get_pointer(ZoneId("shop", "t1"))
    assert pointer is not None
    with conn:
        q.enqueue_on(conn, "ship", {"now": True}, app="shop", tenant="t1")
    after = q.toplevel.get_pointer(ZoneId("shop", "t1"))
    assert after is not None and after.vesting_ms < pointer.vesting_ms
    assert q.run_until_idle() == 1 and runs == [{"now": True}]


def test_several_enqueues_in_one_app_transaction(q: Quick, conn: sqlite3.Connection) -> None:
    runs = _record_runs(q)
    with conn:
        for n in range(3):
            conn.execute("INSERT INTO orders (id, what) VALUES (?, 'x')", (n,))
            q.enqueue_on(conn, "ship", n, app="shop", tenant=f"t{n % 2}")
    assert q.run_until_idle() == 3 and sorted(runs) == [0, 1, 2]  # type: ignore[type-var]


def test_a_quick_transaction_that_read_the_zone_conflicts_with_the_app_commit(
    q: Quick, conn: sqlite3.Connection
) -> None:
    """Same conflict rules as any other commit: a quick transaction that read what the
    app's enqueue wrote, before the app committed, fails to commit (1020)."""
    zone = ZoneId("shop", "t1")
    index_key = q.keys.pointer_index_key(q.toplevel.cluster, q.toplevel.shard_for(zone), zone)
    tr = q.kv.create_transaction()
    assert tr.get(index_key) is None  # read before the app's commit
    tr.set(b"other", b"write")
    with conn:
        q.enqueue_on(conn, "ship", {}, app="shop", tenant="t1")
    with pytest.raises(KVError) as caught:
        tr.commit()
    assert caught.value.code == 1020


def test_other_commits_wait_for_the_app_transaction(db: Path) -> None:
    """While the app's transaction holds SQLite's write lock, other writers wait (and give
    up with StoreBusy after busy_timeout_ms), exactly as with any other SQLite writer."""
    q = Quick.open(f"sqlite:///{db}?busy_timeout_ms=200")
    app = sqlite3.connect(db)
    try:
        q.enqueue_on(app, "ship", {}, app="shop", tenant="t1")
        failure: list[BaseException] = []

        def other() -> None:
            try:
                q.enqueue("ship", {}, app="shop", tenant="t2")
            except BaseException as err:
                failure.append(err)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert failure and isinstance(failure[0], StoreBusy)
        app.commit()
        q.enqueue("ship", {}, app="shop", tenant="t2")  # the lock is free again
        ran = _record_runs(q)
        assert q.run_until_idle() == 2 and len(ran) == 2
    finally:
        app.close()
        q.close()


def test_connection_to_another_file_is_refused(q: Quick, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE t (x)")
    with pytest.raises(ConfigurationError, match=r"other\.db"):
        q.enqueue_on(other, "ship", {}, app="shop", tenant="t1")
    other.rollback()
    other.close()


def test_autocommit_connection_without_a_transaction_is_refused(q: Quick, db: Path) -> None:
    auto = sqlite3.connect(db, isolation_level=None)
    try:
        with pytest.raises(ConfigurationError, match="autocommit"):
            q.enqueue_on(auto, "ship", {}, app="shop", tenant="t1")
        # With an explicit BEGIN it works.
        auto.execute("BEGIN")
        item_id = q.enqueue_on(auto, "ship", {}, app="shop", tenant="t1")
        auto.execute("COMMIT")
        assert q.get("shop", "t1", item_id) is not None
    finally:
        auto.close()


def test_not_a_connection_is_refused(q: Quick) -> None:
    with pytest.raises(ConfigurationError, match=r"sqlite3\.Connection"):
        q.enqueue_on(object(), "ship", {}, app="shop", tenant="t1")


def test_closed_connection_is_refused(q: Quick, db: Path) -> None:
    c = sqlite3.connect(db)
    c.close()
    with pytest.raises(ConfigurationError, match="closed"):
        q.enqueue_on(c, "ship", {}, app="shop", tenant="t1")


def test_stale_snapshot_is_a_clear_error_and_the_app_can_retry(q: Quick, db: Path) -> None:
    """The app's transaction read before another commit: SQLite cannot upgrade it to a
    write; the enqueue says so and nothing is stored."""
    app = sqlite3.connect(db, isolation_level=None)
    try:
        app.execute("BEGIN")
        app.execute("SELECT count(*) FROM kv").fetchone()  # the snapshot starts here
        q.enqueue("ship", {}, app="shop", tenant="other")  # another commit
        with pytest.raises(KVError, match="roll it back") as caught:
            q.enqueue_on(app, "ship", {}, app="shop", tenant="t1")
        assert caught.value.retryable
        app.execute("ROLLBACK")
        assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is None
        app.execute("BEGIN")
        q.enqueue_on(app, "ship", {}, app="shop", tenant="t1")
        app.execute("COMMIT")
        assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is not None
    finally:
        app.close()


def test_memory_store_says_it_cannot(tmp_path: Path) -> None:
    q = Quick.open("memory://")
    c = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(UnsupportedByStore, match="sqlite"):
        q.enqueue_on(c, "ship", {}, app="shop", tenant="t1")
    c.close()


def test_a_commit_long_after_the_enqueue_still_conflicts(
    q: Quick, conn: sqlite3.Connection
) -> None:
    """The app may commit long after its enqueue; quick transactions that read before that
    commit must still see the conflict even once old conflict rows were pruned."""
    zone = ZoneId("shop", "t1")
    index_key = q.keys.pointer_index_key(q.toplevel.cluster, q.toplevel.shard_for(zone), zone)
    store = q.kv
    q.enqueue_on(conn, "ship", {}, app="shop", tenant="t1")
    # The app's commit version was taken at the enqueue; pretend the app then held its
    # transaction for a minute: move the store's clock on before it commits.
    store.clock = _Later(store.clock, 60.0)  # type: ignore[attr-defined]
    tr = store.create_transaction()
    assert tr.get(index_key) is None  # a reader from before the app's commit
    tr.set(b"other", b"write")
    conn.commit()
    for n in range(70):  # enough commits for a prune (every 64 commits per process)
        run(store, lambda t, n=n: t.set(b"filler", str(n).encode()))
    with pytest.raises(KVError) as caught:
        tr.commit()
    assert caught.value.code in (1020, 1007)


class _Later:
    def __init__(self, base: object, offset_s: float) -> None:
        self.base = base
        self.offset_s = offset_s

    def now(self) -> float:
        return self.base.now() + self.offset_s  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self.base, name)


# --- SQLAlchemy -----------------------------------------------------------------------------


def test_sqlalchemy_connection_commits_row_and_item_together(q: Quick, db: Path) -> None:
    from sqlalchemy import create_engine, text

    runs = _record_runs(q)
    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as c:
            c.execute(text("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, what TEXT)"))
        with engine.begin() as c:
            c.execute(text("INSERT INTO orders (id, what) VALUES (7, 'kite')"))
            q.enqueue_on(c, "ship", {"order": 7}, app="shop", tenant="t1")
        with pytest.raises(RuntimeError), engine.begin() as c:
            c.execute(text("INSERT INTO orders (id, what) VALUES (8, 'yoyo')"))
            q.enqueue_on(c, "ship", {"order": 8}, app="shop", tenant="t1")
            raise RuntimeError("declined")
        # The enqueue may come first too: it opens the transaction SQLAlchemy commits.
        with engine.connect() as c:
            q.enqueue_on(c, "ship", {"order": 9}, app="shop", tenant="t1")
            c.execute(text("INSERT INTO orders (id, what) VALUES (9, 'top')"))
            c.commit()
    finally:
        engine.dispose()
    assert _orders(db) == [(7, "kite"), (9, "top")]
    assert q.run_until_idle() == 2
    assert runs == [{"order": 7}, {"order": 9}]


def test_sqlalchemy_engine_on_another_file_is_refused(q: Quick, tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    try:
        with engine.begin() as c, pytest.raises(ConfigurationError, match=r"elsewhere\.db"):
            q.enqueue_on(c, "ship", {}, app="shop", tenant="t1")
    finally:
        engine.dispose()


# --- a real worker process -----------------------------------------------------------------

WORKER_APP = textwrap.dedent(
    """
    import os, sqlite3
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_STORE"])

    @q.job("ship")
    def ship(payload, ctx):
        # The handler updates the app's own table in the same file.
        with sqlite3.connect(os.environ["APP_DB"]) as c:
            c.execute("UPDATE orders SET what = 'shipped' WHERE id = ?", (payload["order"],))
            with open(os.environ["RUN_LOG"], "a") as log:
                log.write(f"{payload['order']}\\n")
    """
)


def test_quick_worker_runs_what_the_app_committed_and_nothing_it_rolled_back(
    q: Quick, conn: sqlite3.Connection, db: Path, tmp_path: Path
) -> None:
    (tmp_path / "shopapp.py").write_text(WORKER_APP)
    run_log = tmp_path / "runs.log"
    env = {
        **os.environ,
        "QUICK_STORE": f"sqlite:///{db}",
        "APP_DB": str(db),
        "RUN_LOG": str(run_log),
    }
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "shopapp:q"]
    worker = subprocess.Popen([*cmd, "--managers", "1"], cwd=tmp_path, env=env)
    try:
        for n in range(6):
            try:
                with conn:
                    conn.execute("INSERT INTO orders (id, what) VALUES (?, 'new')", (n,))
                    q.enqueue_on(conn, "ship", {"order": n}, app="shop", tenant=f"t{n % 3}")
                    if n % 2:
                        raise RuntimeError("declined")
            except RuntimeError:
                pass
        deadline = time.monotonic() + 60
        shipped = [(0, "shipped"), (2, "shipped"), (4, "shipped")]
        while time.monotonic() < deadline and worker.poll() is None and _orders(db) != shipped:
            time.sleep(0.05)
        assert _orders(db) == shipped
        assert sorted(run_log.read_text().split()) == ["0", "2", "4"]  # rolled back: never run
        assert worker.poll() is None
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)


def test_another_threads_connection_is_refused_with_sqlites_reason(q: Quick, db: Path) -> None:
    made: list[sqlite3.Connection] = []
    t = threading.Thread(target=lambda: made.append(sqlite3.connect(db)))
    t.start()
    t.join()
    with pytest.raises(ConfigurationError, match="thread"):
        q.enqueue_on(made[0], "ship", {}, app="shop", tenant="t1")
    assert q.run_until_idle() == 0


def test_app_threads_and_a_running_consumer_at_once(db: Path) -> None:
    """Producers enqueueing in their own transactions (some rolled back) while a consumer
    runs in the same process: every committed item runs once, no rolled-back one ever."""
    q = Quick.open(f"sqlite:///{db}")
    with sqlite3.connect(db) as setup:
        setup.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, what TEXT)")
    setup.close()
    ran: list[int] = []
    lock = threading.Lock()

    @q.job("ship")
    def ship(payload: object, ctx: JobContext) -> None:
        assert isinstance(payload, dict)
        with lock:
            ran.append(payload["order"])

    consumer = q.consumer()
    consumer.start()
    committed: list[int] = []

    def producer(first: int) -> None:
        c = sqlite3.connect(db, timeout=30)
        try:
            for n in range(first, first + 20):
                try:
                    with c:
                        c.execute("INSERT INTO orders (id, what) VALUES (?, 'x')", (n,))
                        q.enqueue_on(c, "ship", {"order": n}, app="shop", tenant=f"t{n % 4}")
                        if n % 3 == 0:
                            raise RuntimeError("declined")
                    with lock:
                        committed.append(n)
                except RuntimeError:
                    pass
        finally:
            c.close()

    threads = [threading.Thread(target=producer, args=(k * 100,)) for k in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(ran) < len(committed):
            time.sleep(0.05)
    finally:
        consumer.stop()
        q.close()
    assert sorted(ran) == sorted(committed)
    assert sorted(committed) == [n for n in sorted(committed) if n % 3 != 0]
    assert [row[0] for row in _orders(db)] == sorted(committed)


def test_fifo_items_and_a_repeated_id_in_one_app_transaction(
    q: Quick, conn: sqlite3.Connection
) -> None:
    runs = _record_runs(q)
    with conn:
        for n in range(3):
            q.enqueue_on(conn, "ship", n, app="shop", tenant="t1", fifo=True)
        first = q.enqueue_on(conn, "ship", "once", app="shop", tenant="t1", item_id="x")
        again = q.enqueue_on(conn, "ship", "once", app="shop", tenant="t1", item_id="x")
    assert first.duplicate is None  # type: ignore[attr-defined]
    assert again.duplicate == "queued"  # type: ignore[attr-defined]
    assert q.run_until_idle() == 4
    assert [r for r in runs if r != "once"] == [0, 1, 2]  # FIFO: in enqueue order
    assert "once" in runs


CRASHING_APP = textwrap.dedent(
    """
    import os, sqlite3, sys
    from quickzones.client import Quick

    db, commit = sys.argv[1], sys.argv[2] == "commit"
    q = Quick.open(f"sqlite:///{db}")
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO orders (id, what) VALUES (1, 'book')")
    q.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t1", item_id="ship-1")
    if commit:
        conn.commit()
    os._exit(0)  # killed: no cleanup, no rollback, no part two afterwards
    """
)


@pytest.mark.parametrize("commit", [True, False], ids=["after-commit", "before-commit"])
def test_a_crash_keeps_both_or_neither(
    q: Quick, conn: sqlite3.Connection, db: Path, tmp_path: Path, commit: bool
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_APP)
    mode = "commit" if commit else "crash"
    subprocess.run([sys.executable, str(script), str(db), mode], check=True, timeout=60)
    runs = _record_runs(q)
    if commit:
        assert _orders(db) == [(1, "book")]
        assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is not None
        assert q.run_until_idle() == 1 and runs == [{"order": 1}]
    else:
        assert _orders(db) == []
        assert q.get("shop", "t1", "ship-1") is None
        assert q.toplevel.get_pointer(ZoneId("shop", "t1")) is None
        assert q.run_until_idle() == 0


# --- Django (in a process of its own: its settings are process-wide) --------------------------

DJANGO_APP = textwrap.dedent(
    """
    import sys

    import django
    from django.conf import settings

    db = sys.argv[1]
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": db}},
        USE_TZ=True,
    )
    django.setup()
    from django.db import connection, transaction

    from quickzones.client import Quick
    from quickzones.errors import UnusableConnection

    q = Quick.open(f"sqlite:///{db}")
    try:  # outside atomic(), Django runs in autocommit: refused
        q.enqueue_on(connection, "ship", {"order": 0}, app="shop", tenant="t1")
        sys.exit("autocommit was not refused")
    except UnusableConnection as err:
        assert "autocommit" in str(err), err
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (id, what) VALUES (5, 'django')")
        q.enqueue_on(connection, "ship", {"order": 5}, app="shop", tenant="t1")
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO orders (id, what) VALUES (6, 'django')")
            q.enqueue_on(connection, "ship", {"order": 6}, app="shop", tenant="t1")
            raise RuntimeError("declined")
    except RuntimeError:
        pass
    """
)


def test_django_connection_inside_atomic(
    q: Quick, conn: sqlite3.Connection, db: Path, tmp_path: Path
) -> None:
    pytest.importorskip("django")
    script = tmp_path / "django_app.py"
    script.write_text(DJANGO_APP)
    proc = subprocess.run(
        [sys.executable, str(script), str(db)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = _record_runs(q)
    assert _orders(db) == [(5, "django")]
    assert q.run_until_idle() == 1 and runs == [{"order": 5}]


def test_bad_input_leaves_the_connection_as_it_was(q: Quick, conn: sqlite3.Connection) -> None:
    """A refused enqueue stores nothing, and a transaction the call opened is closed again,
    so an app that catches the error does not keep holding the write lock."""
    with pytest.raises(InvalidArgument):
        q.enqueue_on(conn, "ship", {}, app="", tenant="t1")
    assert not conn.in_transaction
    q.enqueue("ship", {}, app="shop", tenant="t2")  # not blocked by the app's connection
    # Inside the app's own transaction the app decides: its row is still there to commit.
    conn.execute("INSERT INTO orders (id, what) VALUES (1, 'book')")
    with pytest.raises(InvalidArgument):
        q.enqueue_on(conn, "ship", {}, app="shop", tenant="t1", delay=-1)
    assert conn.in_transaction
    conn.commit()
    ran = _record_runs(q)
    assert q.run_until_idle() == 1 and len(ran) == 1
