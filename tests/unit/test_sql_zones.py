"""Zones native in SQL (``sqlite:///path?zones=sql``, ``postgresql://...?zones=sql``), from
the user's side: a ``quick worker`` process drains what producer processes enqueue, each
item once (on both stores); pointers
are made, requeued and collected as on the KV zones; dead letters are listed where the
CLI reads them; what the native zones cannot do yet is refused by name, and a store of
one layout opened as the other is refused before its queued work is hidden."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import InvalidStoreURL, UnsupportedByStore
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.outcomes import DuplicateItemMismatch
from quickzones.store.sql import SQLZoneStore, ZoneLayoutMismatch
from quickzones.store.sql.zones import NEXT_VESTING_AHEAD_MS
from quickzones.store.zonestore import NewItem
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.waiting import wait_for


def _url(store: str, tmp_path: Path) -> str:
    """A fresh store of ``store`` ("sqlite" or "postgres") with zones=sql."""
    if store == "sqlite":
        return f"sqlite:///{tmp_path / 'q.db'}?zones=sql"
    reason = postgres_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from tests.postgres import postgres_store_url

    return postgres_store_url() + "&zones=sql"


STORES = ["sqlite", "postgres"]

APP = textwrap.dedent(
    """
    import os
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_TEST_URL"])
    out = os.environ["QUICK_TEST_OUT"]

    @q.job("job")
    def job(payload, ctx):
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (ctx.item_id + "\\n").encode())  # one line, appended at once
        finally:
            os.close(fd)
    """
)
PRODUCER = textwrap.dedent(
    """
    import os, sys
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_TEST_URL"])
    ids = [
        q.enqueue("job", {"n": n}, app="a", tenant=f"t{n % 20}")
        for n in range(int(sys.argv[1]))
    ]
    print("\\n".join(ids))
    """
)


WORKER = [sys.executable, "-m", "quickzones", "worker", "--app-module", "sql_app:q"]


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    (tmp_path / "sql_app.py").write_text(APP)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]),
        "QUICK_TEST_URL": url,
        "QUICK_TEST_OUT": str(tmp_path / "ran.txt"),
    }


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("processes", [1, 3])
def test_a_quick_worker_runs_each_item_of_producer_processes_once(
    tmp_path: Path, processes: int, store: str
) -> None:
    """Consumer processes contend with each other and with the producers (for SQLite's
    write lock; for PostgreSQL's row locks); every item runs once and the zones end
    empty."""
    url = _url(store, tmp_path)
    Quick.open(url).close()  # the tables, before the processes race to make them
    env = _env(tmp_path, url)
    worker = subprocess.Popen(
        [*WORKER, "--processes", str(processes)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        producers = [
            subprocess.Popen(
                [sys.executable, "-c", PRODUCER, "1000"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [p.communicate(timeout=120)[0] for p in producers]
        assert [p.returncode for p in producers] == [0, 0]
        enqueued = [i for out in outputs for i in out.split()]
        ran = tmp_path / "ran.txt"

        def done() -> bool:
            return ran.exists() and len(ran.read_text().split()) >= len(enqueued)

        assert wait_for(done, timeout=120), "the worker did not run every item"
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert len(enqueued) == 2000
    assert sorted(ran.read_text().split()) == sorted(enqueued)  # each once, none lost
    assert worker.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err, err.decode()[-2000:]
    q = Quick.open(url)
    try:
        assert sum(q.items.counts([q.zone("a", f"t{n}") for n in range(20)])) == 0
    finally:
        q.close()


@pytest.fixture(params=STORES)
def sq(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    clock = ManualClock()
    q = Quick.open(_url(str(request.param), tmp_path), clock=clock)
    yield q, clock
    q.close()


def test_a_drained_zone_loses_its_pointer_and_gets_a_new_one(sq: Any) -> None:
    q, clock = sq
    assert isinstance(q.items, SQLZoneStore)
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload))
    q.enqueue("job", "one", app="a", tenant="t")
    zone = q.zone("a", "t")
    first = q.toplevel.get_pointer(zone)
    assert first is not None
    config = ConsumerConfig(in_order=True, min_inactive_s=5)
    assert q.run_until_idle(config) == 1
    # Requeued while its item was leased: it vests at that lease's end (30 s).
    assert q.toplevel.get_pointer(zone) is not None
    clock.advance(31)
    q.run_until_idle(config)  # a visit of the zone, empty for 31 s, collects its pointer
    assert q.toplevel.get_pointer(zone) is None
    q.enqueue("job", "two", app="a", tenant="t", delay=10)
    second = q.toplevel.get_pointer(zone)
    assert second is not None and second.pointer_id != first.pointer_id
    assert q.run_until_idle(config) == 0  # not vested
    clock.advance(11)
    assert q.run_until_idle(config) == 1
    assert ran == ["one", "two"]


@pytest.mark.parametrize(
    ("later", "lease_s", "first_s", "then_s"),
    [
        ([(1, 0)], 30, 1, None),  # an item due within the look: exactly then
        ([], 1.5, 1.5, None),  # the lease of the one that ran ends first
        ([(10, 0)], 30, 2, 10),  # due past the look: the pointer vests at its end...
        ([(40, 0)], 30, 2, 40),  # ...then exactly (the lease ended: the item ran)
        ([(40, 0), (15, 5)], 30, 2, 15),  # the earliest of every priority
        ([], 30, 2, 5),  # empty: min_inactive_s after its last activity, then collected
    ],
)
def test_a_visit_requeues_the_pointer_at_the_zones_next_vesting_time(
    sq: Any, later: list[tuple[int, int]], lease_s: float, first_s: float, then_s: int | None
) -> None:
    """After a visit, a zone's pointer vests when the zone next needs one: the earliest of
    its other items' vesting times and the lease of what the visit took, in every
    priority, never later (an item waits past its time). The read looks for it
    ``NEXT_VESTING_AHEAD_MS`` (2 s) past its horizon, not to the lease's end: a zone
    with nothing due by then is visited then, and that visit, with nothing to take,
    looks on to the zone's next vesting time (beside a report's snapshot, each item the
    zone completed within the lease kept its leased version ahead of now, and a read to
    the lease's end fetched them all)."""
    q, clock = sq
    q.job("job")(lambda payload, ctx: None)
    q.enqueue("job", "now", app="a", tenant="t")
    for delay, priority in later:
        q.enqueue("job", f"in {delay}", app="a", tenant="t", delay=delay, priority=priority)
    start = int(clock.now() * 1000)
    config = ConsumerConfig(in_order=True, item_lease_s=lease_s, min_inactive_s=5)
    assert q.run_until_idle(config) == 1
    pointer = q.toplevel.get_pointer(q.zone("a", "t"))
    assert pointer is not None and pointer.vesting_ms == start + first_s * 1000
    assert first_s * 1000 <= NEXT_VESTING_AHEAD_MS
    if then_s is not None:
        clock.advance(first_s)
        assert q.run_until_idle(config) == 0
        pointer = q.toplevel.get_pointer(q.zone("a", "t"))
        assert pointer is not None and pointer.vesting_ms == start + then_s * 1000


def test_an_enqueue_pulls_an_idle_pointer_earlier(sq: Any) -> None:
    q, clock = sq
    q.enqueue("job", "later", app="a", tenant="t", delay=60)
    q.enqueue("job", "now", app="a", tenant="t")
    pointer = q.toplevel.get_pointer(q.zone("a", "t"))
    assert pointer is not None and pointer.vesting_ms <= int(clock.now() * 1000)


def test_a_failed_item_is_dead_lettered_where_the_cli_lists_it(sq: Any) -> None:
    q, _ = sq

    @q.job("job", retry=RetryPolicy(max_attempts=1))
    def job(payload: Any, ctx: JobContext) -> None:
        raise RuntimeError("broken")

    item_id = q.enqueue("job", b"x", app="a", tenant="t")
    q.run_until_idle(ConsumerConfig(in_order=True))
    [letter] = q.dead_letters("a")
    assert letter.item_id == item_id and letter.item is not None
    assert "broken" in letter.reason
    assert (letter.item.attempts, letter.item.error_count) == (1, 1)
    assert q.items.count(q.zone("a", "t")) == 0


def test_a_caller_chosen_id_is_enqueued_once(sq: Any) -> None:
    q, _ = sq
    first = q.enqueue("job", b"x", app="a", tenant="t", item_id="order-1")
    again = q.enqueue("job", b"x", app="a", tenant="t", item_id="order-1")
    assert (first, again, again.duplicate) == ("order-1", "order-1", "queued")
    assert q.items.count(q.zone("a", "t")) == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.enqueue("job", b"", app="a", tenant="t", fifo=True),
        lambda q: q.enqueue("job", b"", app="a", tenant="t", idempotency_key="k"),
        lambda q: (
            q.run_until_idle(ConsumerConfig(in_order=True))
            or q.job("tx", transactional=True)(lambda p, c: None)
        ),
        lambda q: q.enqueue_local("job"),
    ],
    ids=["fifo", "idempotency-key", "transactional", "local"],
)
def test_what_sql_zones_cannot_do_yet_is_refused_by_name(sq: Any, call: Any) -> None:
    q, _ = sq
    with pytest.raises(UnsupportedByStore):
        call(q)
    assert q.items.count(q.zone("a", "t")) == 0  # nothing stored


def test_a_bad_zones_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidStoreURL, match="zones must be one of"):
        Quick.open(f"sqlite:///{tmp_path / 'q.db'}?zones=native")


def test_a_store_is_refused_in_the_layout_its_work_is_not_in(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    kv = Quick.open(f"sqlite:///{path}")
    kv.enqueue("job", b"", app="a", tenant="t")
    kv.close()
    with pytest.raises(ZoneLayoutMismatch, match="KV layout"):
        Quick.open(f"sqlite:///{path}?zones=sql")
    other = tmp_path / "sql.db"
    sql = Quick.open(f"sqlite:///{other}?zones=sql")
    sql.enqueue("job", b"", app="a", tenant="t")
    sql.close()
    with pytest.raises(ZoneLayoutMismatch, match="zones=sql"):
        Quick.open(f"sqlite:///{other}")
    kept = Quick.open(f"sqlite:///{other}?zones=sql")  # nothing was lost meanwhile
    try:
        assert kept.items.count(kept.zone("a", "t")) == 1
    finally:
        kept.close()


def test_a_dequeue_with_a_horizon_takes_unleased_items_due_within_it_held(sq: Any) -> None:
    q, clock = sq
    zone = q.zone("a", "t")
    now = int(clock.now() * 1000)
    soon = q.enqueue("job", b"soon", app="a", tenant="t", delay=0.5)
    q.enqueue("job", b"later", app="a", tenant="t", delay=5)
    vested = q.enqueue("job", b"now", app="a", tenant="t")
    taken, _ = q.items.dequeue(zone, 10, 30_000, horizon_ms=1_000)
    assert [i.item_id for i in taken] == [vested, soon]  # vested first; "later" beyond it
    first, ahead = taken
    assert not first.held and first.attempts == 1
    assert ahead.held and ahead.attempts == 0  # counted at its start, on its own timer
    assert ahead.vesting_ms == now + 500 + 30_000  # its lease runs from when it is due
    other, _ = q.items.dequeue(zone, 10, 30_000, horizon_ms=10_000)
    assert [i.payload for i in other] == [b"later"]  # the held one is not taken again


@pytest.mark.parametrize("store", STORES)
def test_delayed_jobs_never_start_early_on_a_running_worker(tmp_path: Path, store: str) -> None:
    import threading
    import time

    q = Quick.open(_url(store, tmp_path))
    started: dict[str, float] = {}
    lock = threading.Lock()

    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        with lock:
            started[payload["id"]] = time.time()

    consumer = q.consumer(ConsumerConfig(workers=4))
    consumer.start()
    try:
        due = {}
        for n in range(30):
            delay = 0.2 + (n % 10) * 0.05
            due[str(n)] = time.time() + delay
            q.enqueue("job", {"id": str(n)}, app="a", tenant=f"t{n % 3}", delay=delay)
        assert wait_for(lambda: len(started) == 30, timeout=30)
    finally:
        consumer.stop()
        q.close()
    early = {n: due[n] - at for n, at in started.items() if at < due[n] - 0.001}
    assert not early, f"started before they were due (s early): {early}"


def test_another_job_under_a_queued_id_is_refused_in_a_batch_too(sq: Any) -> None:
    """``enqueue_many`` writes its items in one transaction: one of them reusing a queued
    id with another payload refuses the whole batch, none of it stored."""
    q, _ = sq
    q.enqueue("job", b"x", app="a", tenant="t", item_id="i1")
    with pytest.raises(DuplicateItemMismatch):
        q.items.enqueue_many(
            q.zone("a", "t"),
            [NewItem("job", b"other", item_id="i1"), NewItem("job", b"z", item_id="i2")],
        )
    assert q.get("a", "t", "i2") is None
    assert q.items.count(q.zone("a", "t")) == 1
    same = q.items.enqueue_many(q.zone("a", "t"), [NewItem("job", b"x", item_id="i1")])
    assert same == ["i1"] and q.items.count(q.zone("a", "t")) == 1


def test_an_enqueue_while_a_visit_holds_its_zone_is_not_stranded(sq: Any) -> None:
    """A one-transaction visit takes a zone's last item and, before it commits, a producer
    enqueues into the zone: the producer waits for the visit (SQLite's write lock, the
    pointer's row lock on PostgreSQL), then pulls the requeued pointer to its item, which
    the next scan finds at once; a drained zone's pointer is never left vesting later
    than an item in it (invariant 2)."""
    import threading
    import time

    q, _ = sq
    zone = q.zone("a", "t")
    q.enqueue("job", b"first", app="a", tenant="t")
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None
    from quickzones.store.toplevel import PointerRef

    ref = PointerRef(0, pointer.pointer_id, pointer.vesting_ms, q.toplevel.cluster)
    late: list[str] = []
    producer = threading.Thread(
        target=lambda: late.append(q.enqueue("job", b"second", app="a", tenant="t"))
    )

    def visit(tr: Any) -> str:
        stored, leased = q.toplevel.lease_pointer(ref, 1_000, tr=tr)
        taken, _ = q.items.dequeue(zone, 10, 30_000, tr=tr)
        assert [i.payload for i in taken] == [b"first"]
        producer.start()
        time.sleep(0.2)  # the producer is waiting for this visit's lock now
        return str(
            q.toplevel.requeue_pointer(
                leased,
                lambda t: q.items.min_vesting_ms(zone, tr=t),
                lambda t: q.items.zone_is_empty(t, zone),
                min_inactive_ms=60_000,
                active=True,
                stored=(0, stored),
                tr=tr,
            )
        )

    assert q.toplevel.run_visit(visit) == "requeued"
    producer.join(10)
    assert late, "the producer never enqueued"
    after = q.toplevel.get_pointer(zone)
    assert after is not None and after.lease_id is None
    item = q.get("a", "t", late[0])
    assert item is not None and after.vesting_ms <= item.vesting_ms


def test_a_visit_holding_the_write_lock_never_waits_for_the_clocks_own_exchange(
    tmp_path: Path,
) -> None:
    """The steady clock publishes its floor in a KV transaction once a second, from
    whichever thread reads the time then. On SQLite a one-transaction visit reads the time
    while it holds the file's write lock, which that exchange needs: the visit waited for
    itself until the store's busy timeout (one delayed job 10 s late in bench.peers_users)
    and failed. The exchange waits for a reading outside the lock instead."""
    import threading

    from quickzones.store.toplevel import PointerRef

    url = f"sqlite:///{tmp_path / 'q.db'}?zones=sql&busy_timeout_ms=3000"
    q = Quick.open(url)  # the system clock, made steady: it exchanges its floor
    zone = q.zone("a", "t")
    q.enqueue("job", "x", app="a", tenant="t")
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None
    ref = PointerRef(0, pointer.pointer_id, pointer.vesting_ms, q.toplevel.cluster)
    outcome: list[object] = []

    def visit(tr: Any) -> int:
        q.clock._next_sync = 0.0  # type: ignore[attr-defined]  # due at its next reading
        q.toplevel.lease_pointer(ref, 1_000, tr=tr)  # reads the time, under the lock
        taken, _ = q.items.dequeue(zone, 10, 30_000, tr=tr)
        return len(taken)

    def run() -> None:
        try:
            outcome.append(q.toplevel.run_visit(visit))
        except Exception as err:  # StoreBusy, before the fix
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(2.5)
    try:
        assert outcome == [1], f"the visit waited for the write lock it held: {outcome}"
    finally:
        thread.join(10)
        q.close()


def test_an_apps_enqueue_rate_is_enforced(sq: Any) -> None:
    from quickzones.store.limits import AppLimits, RateLimited

    q, _ = sq
    q.set_limits("a", AppLimits(enqueues_per_minute=2))
    q.enqueue("job", b"1", app="a", tenant="t")
    q.enqueue("job", b"2", app="a", tenant="t")
    with pytest.raises(RateLimited):
        q.enqueue("job", b"3", app="a", tenant="t")
    assert q.items.count(q.zone("a", "t")) == 2  # the refused one stored nothing
    q.enqueue("job", b"other app", app="b", tenant="t")  # another app is not limited


def test_resharding_is_refused_and_changes_nothing(sq: Any) -> None:
    """``quick reshard`` moves the KV layout's pointers only: on zones=sql it would flip
    the layout and leave these pointers in shards no consumer polls."""
    from quickzones.store.reshard import reshard

    q, _ = sq
    q.job("job")(lambda payload, ctx: None)
    q.enqueue("job", b"x", app="a", tenant="t")
    with pytest.raises(UnsupportedByStore, match="resharding"):
        reshard(q.toplevel, 4)
    assert q.toplevel.refresh_layout().shards == 1
    assert q.run_until_idle(ConsumerConfig(in_order=True)) == 1


def test_a_tenant_move_is_refused_and_moves_nothing(sq: Any, tmp_path: Path) -> None:
    """A tenant move reads and writes the KV layout's item keys: from or to a zones=sql
    store it is refused before anything moves."""
    from quickzones.store.tenant_move import move_tenant

    q, _ = sq
    q.enqueue("job", b"x", app="a", tenant="t")
    other = Quick.open(f"sqlite:///{tmp_path / 'kv.db'}")
    try:
        for source, target in ((q, other), (other, q)):
            with pytest.raises(UnsupportedByStore, match="tenant move"):
                move_tenant(source, target, "a", "t")
        assert q.items.count(q.zone("a", "t")) == 1
        assert q.toplevel.get_pointer(q.zone("a", "t")) is not None
    finally:
        other.close()


def test_work_after_a_native_commit_that_fails_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A visit's dead letters are written after its commit: one that fails must not turn
    the committed visit into a failed one (its leased items would be dropped unstarted)."""
    from quickzones.store.sql import SQLTransaction

    ran: list[str] = []
    tr = SQLTransaction(conn=None)

    def broken() -> None:
        raise RuntimeError("store unreachable")

    tr.after_commit(broken)
    tr.after_commit(lambda: ran.append("second"))
    tr.committed()
    assert ran == ["second"]
    assert "work after a native commit failed" in caplog.text


def test_enqueue_on_commits_with_the_applications_rows_or_not_at_all(tmp_path: Path) -> None:
    """SQLite with zones=sql: ``enqueue_on`` writes the item and its pointer in the
    application's own transaction, through its own connection: COMMIT stores both, and a
    worker runs the item; ROLLBACK neither."""
    import sqlite3

    path = tmp_path / "app.db"
    q = Quick.open(f"sqlite:///{path}?zones=sql")
    ran: list[Any] = []
    q.job("ship")(lambda payload, ctx: ran.append(payload))
    app = sqlite3.connect(path, isolation_level=None)
    app.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    try:
        app.execute("BEGIN")
        app.execute("INSERT INTO orders (total) VALUES (10)")
        kept = q.enqueue_on(app, "ship", {"order": 1}, app="shop", tenant="t")
        app.execute("COMMIT")
        app.execute("BEGIN")
        app.execute("INSERT INTO orders (total) VALUES (20)")
        q.enqueue_on(app, "ship", {"order": 2}, app="shop", tenant="t")
        app.execute("ROLLBACK")
        assert app.execute("SELECT total FROM orders").fetchall() == [(10,)]
        assert q.items.count(q.zone("shop", "t")) == 1
        assert q.get("shop", "t", kept) is not None
        assert q.run_until_idle(ConsumerConfig(in_order=True)) == 1
        assert ran == [{"order": 1}]
    finally:
        app.close()
        q.close()


def test_enqueue_on_commits_with_the_applications_rows_on_postgres(tmp_path: Path) -> None:
    """PostgreSQL with zones=sql: ``enqueue_on`` writes the item in the application's own
    transaction (its pointer locked there FOR KEY SHARE, or parked outside it first): its
    COMMIT stores the item with the application's row and a worker runs it; its
    ROLLBACK stores neither; an id queued already is the same job, not a second item."""
    import psycopg

    url = _url("postgres", tmp_path)
    q = Quick.open(url)
    ran: list[Any] = []
    q.job("ship")(lambda payload, ctx: ran.append(payload))
    app = psycopg.connect(url.split("?")[0])
    app.execute("CREATE TEMP TABLE orders (id serial PRIMARY KEY, total int)")
    app.commit()
    try:
        with app.transaction():
            app.execute("INSERT INTO orders (total) VALUES (10)")
            kept = q.enqueue_on(app, "ship", {"order": 1}, app="shop", tenant="t")
            again = q.enqueue_on(app, "ship", {"order": 1}, app="shop", tenant="t", item_id=kept)
            assert again == kept and again.duplicate == "queued"
        with pytest.raises(RuntimeError), app.transaction():
            app.execute("INSERT INTO orders (total) VALUES (20)")
            q.enqueue_on(app, "ship", {"order": 2}, app="shop", tenant="u")
            raise RuntimeError("the application rolls back")
        assert app.execute("SELECT total FROM orders").fetchall() == [(10,)]
        assert q.items.count(q.zone("shop", "t")) == 1
        assert q.items.count(q.zone("shop", "u")) == 0
        assert q.get("shop", "t", kept) is not None
        # Part two pulled the parked pointer to the item once the COMMIT was seen.
        assert wait_for(
            lambda: (
                (p := q.toplevel.get_pointer(q.zone("shop", "t"))) is not None
                and p.vesting_ms <= q.get("shop", "t", kept).vesting_ms
            ),  # type: ignore[union-attr]
            10,
        )
        assert q.run_until_idle(ConsumerConfig(in_order=True)) == 1
        assert ran == [{"order": 1}]
    finally:
        app.close()
        q.close()


def test_an_item_of_a_long_serializable_transaction_runs_once_it_commits(tmp_path: Path) -> None:
    """A scan reads pointers from a floor just below the earliest it last saw (so that it
    does not walk the row versions a held snapshot keeps), and a pointer made inside an
    application's SERIALIZABLE transaction that stays open longer becomes visible below
    it: the scan that reads the whole shard, at most ``FULL_SCAN_MS`` later, finds it."""
    import psycopg

    from quickzones.store.sql.toplevel import FULL_SCAN_MS

    clock = ManualClock()
    url = _url("postgres", tmp_path)
    q = Quick.open(url, clock=clock)
    ran: list[Any] = []
    q.job("ship")(lambda payload, ctx: ran.append(payload))
    config = ConsumerConfig(in_order=True)
    app = psycopg.connect(url.split("?")[0])
    try:
        app.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        app.execute("SELECT 1")  # the snapshot: no pointer of the zone in it
        q.enqueue_on(app, "ship", {"order": 1}, app="shop", tenant="t")
        clock.advance(10)  # the request goes on for 10 s; meanwhile a scan sets its floor
        q.enqueue("ship", {"order": 0}, app="shop", tenant="other")
        assert q.run_until_idle(config) == 1
        app.commit()
        q.run_until_idle(config)
        clock.advance(FULL_SCAN_MS / 1000)
        q.run_until_idle(config)
        assert ran == [{"order": 0}, {"order": 1}]
    finally:
        app.close()
        q.close()


@pytest.mark.parametrize("store", STORES)
def test_processes_opening_a_new_store_at_once_all_open_it(tmp_path: Path, store: str) -> None:
    """Web processes starting together each open the new store: its native tables are
    made once, by one of them (PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` from several
    sessions at once failed one with a duplicate key in ``pg_type``)."""
    import threading

    url = _url(store, tmp_path)
    start = threading.Barrier(6)
    failures: list[BaseException] = []
    ids: list[str] = []

    def open_and_enqueue(n: int) -> None:
        try:
            start.wait(10)
            with Quick.open(url) as q:
                ids.append(q.enqueue("job", {"n": n}, app="a", tenant=f"t{n}"))
        except BaseException as err:  # reported by the test's thread
            failures.append(err)

    threads = [threading.Thread(target=open_and_enqueue, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    q = Quick.open(url)
    try:
        assert sum(q.items.counts([q.zone("a", f"t{n}") for n in range(6)])) == len(ids) == 6
    finally:
        q.close()


def test_postgres_native_tables_are_vacuumed_at_two_percent_dead(tmp_path: Path) -> None:
    """Every lease and visit leaves a dead row in the native tables (their vesting times
    are indexed: no update is HOT), so a new store's tables carry autovacuum settings of
    their own (docs/backends.md, "Vacuum"), not PostgreSQL's 20 %."""
    import psycopg

    url = _url("postgres", tmp_path)
    Quick.open(url).close()
    schema = url.split("schema=")[1].split("&")[0]
    with psycopg.connect(url.split("?")[0]) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s"
            " AND c.relname IN ('quick_items', 'quick_pointers')",
            (schema,),
        ).fetchall()
    options = {name: set(opts or []) for name, opts in rows}
    assert "autovacuum_vacuum_scale_factor=0.02" in options["quick_items"]
    assert {"autovacuum_vacuum_scale_factor=0.02", "autovacuum_vacuum_cost_delay=0"} <= options[
        "quick_pointers"
    ]


def test_run_until_idle_right_after_an_applications_commit_runs_its_item(tmp_path: Path) -> None:
    """PostgreSQL with zones=sql: an ``enqueue_on`` into a zone with no pointer parks one
    (vesting later) and part two pulls it to the item after the COMMIT, on the store's
    thread. A test or script that commits and then drains at once must find the item:
    ``run_until_idle`` waits for the part twos of the COMMITs this process saw first
    (it returned 0 about one time in four)."""
    import psycopg

    url = _url("postgres", tmp_path)
    q = Quick.open(url)
    ran: list[Any] = []
    q.job("ship")(lambda payload, ctx: ran.append(payload))
    try:
        with psycopg.connect(url.split("?")[0]) as app:
            for n in range(10):
                with app.transaction():
                    q.enqueue_on(app, "ship", {"n": n}, app="shop", tenant=f"new{n}")
                assert q.run_until_idle() == 1, n
        assert ran == [{"n": n} for n in range(10)]
    finally:
        q.close()


@pytest.mark.parametrize("meanwhile", ["cancelled", "leased by id"])
def test_an_item_changed_while_a_visit_decides_is_never_handed_out(
    tmp_path: Path, meanwhile: str
) -> None:
    """PostgreSQL with zones=sql: a one-transaction visit reads a zone's items, and before
    its leases are written another process cancels one of them, or leases it by id for a
    second. The visit hands out only the item it did lease (its leases are sent with its
    commit and checked once it committed), and the zone's pointer vests no later than
    any item left in it: not at the lease end the visit counted on for the item it did
    not get. (On SQLite the visit holds the write lock: nothing commits meanwhile.)"""
    from quickzones.store.toplevel import PointerRef
    from quickzones.store.zones.dequeue import Left

    url = _url("postgres", tmp_path)
    q = Quick.open(url)
    other = Quick.open(url)
    zone = q.zone("a", "t")
    kept = q.enqueue("job", b"kept", app="a", tenant="t")
    doomed = q.enqueue("job", b"doomed", app="a", tenant="t")
    later = q.enqueue("job", b"later", app="a", tenant="t", delay=3600)
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None
    ref = PointerRef(0, pointer.pointer_id, pointer.vesting_ms, q.toplevel.cluster)
    cancelled: list[str] = []

    def accept(item: Any) -> bool:
        if item.item_id == doomed and not cancelled:
            if meanwhile == "cancelled":  # committed while this visit decides
                other.cancel("a", "t", doomed)
            else:
                other.items.obtain_lease(zone, doomed, 1_000)
            cancelled.append(doomed)
        return True

    def visit(tr: Any) -> list[Any]:
        # As a consumer's visit does: the requeue takes the zone's next vesting time
        # from what the dequeue read (dequeue.Left), reading the zone only where unknown.
        stored, leased = q.toplevel.lease_pointer(ref, 1_000, tr=tr)
        seen = Left()
        taken, _ = q.items.dequeue(zone, 10, 30_000, accept=accept, tr=tr, left=seen)
        q.toplevel.requeue_pointer(
            leased,
            lambda t: seen.earliest(lambda: q.items.min_vesting_ms(zone, tr=t)),
            lambda t: q.items.zone_is_empty(t, zone),
            min_inactive_ms=60_000,
            active=True,
            stored=(0, stored),
            tr=tr,
        )
        return taken  # type: ignore[no-any-return]

    try:
        taken = q.toplevel.run_visit(visit)
        assert cancelled == [doomed]
        assert [i.item_id for i in taken] == [kept]
        assert q.get("a", "t", later) is not None
        after = q.toplevel.get_pointer(zone)
        assert after is not None and after.lease_id is None
        items = [q.get("a", "t", i) for i in (kept, doomed, later)]
        assert after.vesting_ms <= min(i.vesting_ms for i in items if i is not None)
        assert (items[1] is None) == (meanwhile == "cancelled")
    finally:
        other.close()
        q.close()


def test_the_scans_peek_is_bounded_ahead_and_still_sees_what_vests(sq: Any) -> None:
    """``zones=sql``'s peek honours ``ahead_ms`` as every store does (its statement ends
    its index range there) and a consumer still runs a delayed item on its time."""
    q, clock = sq
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload))
    q.enqueue("job", "now", app="a", tenant="now")
    q.enqueue("job", "later", app="a", tenant="later", delay=5)
    now = int(clock.now() * 1000)
    refs, later = q.toplevel.peek(0, 10, ahead_ms=4_999)
    assert len(refs) == 1 and later is None
    assert q.toplevel.peek(0, 10, ahead_ms=5_000) == (refs, now + 5000)
    assert q.toplevel.peek(0, 10) == (refs, now + 5000)
    config = ConsumerConfig(in_order=True)
    assert q.run_until_idle(config) == 1 and ran == ["now"]
    clock.advance(5)
    assert q.run_until_idle(config) == 1 and ran == ["now", "later"]
