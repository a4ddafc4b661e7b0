"""PostgreSQL without a global commit lock (issue 42 point 1): an application's transaction
that enqueued and has not committed yet stops nobody but commits touching its own keys.

Before, every quick commit took one row lock, held by such a transaction from its enqueue
to its COMMIT: another request's enqueue into another tenant, another process's plain
enqueue and every consumer waited for it (a request open 12 s stalled them 11.4 s)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.registry import JobContext
from quickzones.store.limits import AppLimits
from quickzones.store.records import ZoneId
from quickzones.store.steady_clock import SYNC_PERIOD_S
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url
from tests.waiting import returns_within, wait_for

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")


def _kv_url() -> str:
    # A commit would wait this long for a lock: far past the test's own bound, so a
    # wait for the open transaction shows as "still waiting", not as an error.
    return postgres_store_url() + "&lock_timeout_ms=120000"


@pytest.fixture(params=["kv", "sql"])
def url(request: pytest.FixtureRequest) -> str:
    """A store in each zone layout: the KV one (layout 3's commits) and zones=sql (row
    locks of the native tables)."""
    return _kv_url() + ("&zones=sql" if request.param == "sql" else "")


@pytest.fixture()
def kv_url() -> str:
    return _kv_url()


@dataclass
class Native:
    """A zones=sql store whose "job" handler records each item's tenant in ``ran``."""

    q: Quick
    url: str
    ran: list[str]


@pytest.fixture()
def native() -> Iterator[Native]:
    url = _kv_url() + "&zones=sql"
    q = Quick.open(url)
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload["tenant"]))
    yield Native(q, url, ran)
    q.close()


@pytest.fixture()
def q(url: str) -> Iterator[Quick]:
    quick = Quick.open(url)
    yield quick
    quick.close()


class OpenRequest:
    """An application's request on its own thread: BEGIN; INSERT; enqueue_on; then it
    stays open (other work) until released, then COMMITs."""

    def __init__(self, q: Quick, url: str, tenant: str) -> None:
        self.enqueued = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(q, url, tenant), daemon=True)
        self._thread.start()
        assert self.enqueued.wait(30), self.error

    def _run(self, q: Quick, url: str, tenant: str) -> None:
        try:
            with psycopg.connect(url.split("?")[0]) as conn, conn.transaction():
                conn.execute("SELECT 1")
                q.enqueue_on(conn, "job", {"tenant": tenant}, app="shop", tenant=tenant)
                self.enqueued.set()
                self.release.wait(60)
        except BaseException as err:  # handed to the test
            self.error = err
            self.enqueued.set()

    def commit(self) -> None:
        self.release.set()
        self._thread.join(30)
        assert self.error is None, self.error


def test_an_open_application_transaction_stops_no_other_tenant_and_no_consumer(
    q: Quick, url: str
) -> None:
    ran: list[str] = []

    @q.job("job")
    def job(payload: dict[str, str], ctx: JobContext) -> None:
        ran.append(payload["tenant"])

    other = Quick.open(url)  # another process's store object
    other.job("job")(job)
    try:
        q.enqueue("job", {"tenant": "busy"}, app="shop", tenant="busy")
        held = OpenRequest(q, url, "held")
        # Another request's enqueue into another tenant, in its own transaction.
        second = OpenRequest(q, url, "second")
        second.commit()
        # A plain enqueue from another process, into another tenant.
        plain = {"tenant": "plain"}
        returns_within(20, lambda: other.enqueue("job", plain, app="shop", tenant="plain"))
        # A consumer visits and completes the other tenants' items meanwhile.
        assert returns_within(20, lambda: other.run_until_idle()) == 3
        assert sorted(ran) == ["busy", "plain", "second"]
        held.commit()
        # Its pointer vests with it once part two, after the COMMIT, has run.
        assert wait_for(
            lambda: returns_within(20, lambda: other.run_until_idle()) >= 0 and len(ran) == 4, 20
        )
        assert sorted(ran) == ["busy", "held", "plain", "second"]
    finally:
        other.close()


def test_an_open_application_transaction_holds_no_lock_on_the_steady_clock(
    q: Quick, url: str
) -> None:
    """The steady clock exchanges its floor with the store once a second (an atomic max
    on one key every process shares). When that exchange fell inside ``enqueue_on`` it
    joined the application's transaction, whose lock on that key then lasted until the
    application's COMMIT: every other process's next clock exchange (each enqueue's,
    each consumer's) waited for it, up to ``lock_timeout``."""
    q.job("job")(lambda payload, ctx: None)
    other = Quick.open(url)  # another process's store object, with its own clock
    other.job("job")(lambda payload, ctx: None)
    try:
        q.enqueue("job", {}, app="shop", tenant="first")
        other.enqueue("job", {}, app="shop", tenant="first")
        time.sleep(SYNC_PERIOD_S + 0.2)  # q's next clock reading exchanges its floor
        held = OpenRequest(q, url, "held")
        time.sleep(SYNC_PERIOD_S + 0.2)  # and so does other's
        returns_within(20, lambda: other.enqueue("job", {}, app="shop", tenant="plain"))
        held.commit()
    finally:
        other.close()


def test_pointer_collection_never_drops_the_pointer_of_a_zone_an_enqueue_commits_into(
    q: Quick, url: str
) -> None:
    """A zone emptied by its consumer keeps its pointer for min_inactive_s; a consumer
    collecting it while an application's transaction enqueues into the zone must not
    delete it (the item would then wait with no pointer): it waits for that COMMIT or
    fails and tries again later, and the item runs."""
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload["tenant"]))
    q.enqueue("job", {"tenant": "z"}, app="shop", tenant="z")
    collecting = ConsumerConfig(in_order=True, min_inactive_s=0.0)
    assert q.run_until_idle(collecting) == 1
    held = OpenRequest(q, url, "z")
    consumer = threading.Thread(target=lambda: q.run_until_idle(collecting), daemon=True)
    consumer.start()
    consumer.join(1.0)  # it may be waiting for the application's locks
    held.commit()
    consumer.join(30)
    assert not consumer.is_alive()
    assert wait_for(lambda: q.run_until_idle(collecting) >= 0 and ran == ["z", "z"], 20), ran


def test_a_consumer_collecting_a_pointer_an_open_request_holds_neither_waits_nor_drops_it(
    native: Native,
) -> None:
    """zones=sql: the zone's pointer is due, its zone empty, and the consumer collects
    pointers of zones empty for 0 s, while an application's transaction that enqueued
    into the zone is open: the consumer must neither wait for that COMMIT nor delete the
    pointer (the item would wait with none), and the item runs once committed. (The KV
    layout's collection waits for the COMMIT: the test above.)"""
    q, ran = native.q, native.ran
    zone = ZoneId("shop", "z")
    q.enqueue("job", {"tenant": "first"}, app="shop", tenant="z")
    assert q.run_until_idle(ConsumerConfig(in_order=True, min_inactive_s=3600)) == 1
    held = OpenRequest(q, native.url, "z")
    q.toplevel.pull_pointer_earlier(zone, int(time.time() * 1000))  # due now
    collecting = ConsumerConfig(in_order=True, min_inactive_s=0.0)
    try:
        assert returns_within(5, lambda: q.run_until_idle(collecting)) == 0
        assert q.toplevel.get_pointer(zone) is not None
    finally:
        held.commit()
    assert wait_for(lambda: q.run_until_idle(collecting) >= 0 and len(ran) == 2, 20), ran


def test_an_open_application_transaction_holds_up_no_consumer_of_its_own_zone(
    q: Quick, url: str
) -> None:
    """Issue 42 point 1: an application's transaction that enqueued holds at most its own
    zone's pointer row. A consumer visiting that zone for an item committed before must not
    wait for the application's COMMIT (seen: under 8 such requests a second, 50 ms each,
    the visits' p99 was the requests' 50 ms)."""
    ran: list[str] = []
    other = Quick.open(url)  # another process's store object
    other.job("job")(lambda payload, ctx: ran.append(payload["tenant"]))
    try:
        q.enqueue("job", {"tenant": "earlier"}, app="shop", tenant="z")
        held = OpenRequest(q, url, "z")
        try:
            assert returns_within(5, lambda: other.run_until_idle()) == 1
            assert ran == ["earlier"]
        finally:
            held.commit()
    finally:
        other.close()


def test_two_open_requests_into_one_zone_wait_for_neither_each_other_nor_its_consumer(
    q: Quick, url: str
) -> None:
    """Issue 42 point 1: an open request's enqueue holds nothing other enqueuers of its
    zone need. Each enqueue adds to the zone's count: on one shared count row the second
    request's enqueue, and every completion in the zone, waited for the first's COMMIT."""
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload["tenant"]))
    q.enqueue("job", {"tenant": "earlier"}, app="shop", tenant="z")
    first = OpenRequest(q, url, "z")
    second = OpenRequest(q, url, "z")  # raises if its enqueue waits past 30 s
    try:
        assert returns_within(5, lambda: q.run_until_idle()) == 1
        assert ran == ["earlier"]
    finally:
        second.commit()
        first.commit()
    assert wait_for(lambda: q.run_until_idle() >= 0 and len(ran) == 3, 20), ran
    assert q.items.count(ZoneId("shop", "z")) == 0


def test_part_two_sees_the_pointer_a_visit_committing_meanwhile_moved(kv_url: str) -> None:
    """A visit reads its zone and puts the zone's pointer back at a later time (its
    items' leases' end), in one commit. An application's enqueue into that zone no longer
    waits for the visit, nor the visit for it, so its COMMIT can land between the visit's
    check and the visit's end: part two, after that COMMIT, must then see the pointer the
    visit moved and pull it to the new item, or the item waits out the visit's leases.
    Here the visit's commit is held open (an application's transaction stands in for the
    round trip of the visit's own) while the request commits."""
    url = kv_url
    q = Quick.open(url)
    try:
        _part_two_after_a_kv_visit(q, url)
    finally:
        q.close()


def _part_two_after_a_kv_visit(q: Quick, url: str) -> None:
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload["tenant"]))
    zone = ZoneId("shop", "z")
    q.enqueue("job", {"tenant": "earlier"}, app="shop", tenant="z")
    held = OpenRequest(q, url, "z")
    with psycopg.connect(url.split("?")[0]) as visit:

        def read_zone_and_requeue_later() -> None:
            with q.kv.transaction_on(visit) as tr:  # type: ignore[attr-defined]
                tr.get_range(*q.keys.zone_range(zone))  # the new item is not seen
                _requeue_an_hour_later(q, zone, tr, q.toplevel.get_pointer(zone, tr=tr))

        returns_within(10, read_zone_and_requeue_later)  # checked; not ended yet
        held.commit()
        time.sleep(0.5)  # part two runs meanwhile
        visit.commit()
    _pulled_back_and_run(q, zone, ran)


def test_an_open_request_holds_up_no_other_request_of_a_rate_limited_app(
    q: Quick, url: str
) -> None:
    """An app with an enqueue rate limit counts each enqueue in a key of the app's
    minute: an open request's add to it held that row until its COMMIT, so every other
    request's enqueue into any tenant of the app waited (issue 42 point 1)."""
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(payload["tenant"]))
    q.set_limits("shop", AppLimits(enqueues_per_minute=1000))
    first = OpenRequest(q, url, "a")
    try:
        second = OpenRequest(q, url, "b")  # raises if its enqueue waits past 30 s
        second.commit()
        returns_within(5, lambda: q.enqueue("job", {"tenant": "c"}, app="shop", tenant="c"))
    finally:
        first.commit()
    assert wait_for(lambda: q.run_until_idle() >= 0 and sorted(ran) == ["a", "b", "c"], 20), ran


def test_close_waits_for_part_two_under_way_so_nothing_of_quick_runs_after_it(
    kv_url: str,
) -> None:
    """Part two of an application's enqueue runs on the store's thread after the COMMIT.
    A store closed while it was under way returned at once and left it running its
    transaction, so an application that dropped the schema next could meet it (a
    deadlock in DROP SCHEMA ... CASCADE). close() waits for it (here it waits on a commit
    in flight on the pointer, held open until the test ends it)."""
    url = kv_url
    q = Quick.open(url)
    q.job("job")(lambda payload, ctx: None)
    zone = ZoneId("shop", "z")
    q.enqueue("job", {"tenant": "earlier"}, app="shop", tenant="z")
    held = OpenRequest(q, url, "z")
    with psycopg.connect(url.split("?")[0]) as visit:
        with q.kv.transaction_on(visit) as tr:  # type: ignore[attr-defined]
            _requeue_an_hour_later(q, zone, tr, q.toplevel.get_pointer(zone, tr=tr))
        held.commit()  # part two now waits for the visit's commit

        space = q.kv.lock_space & 0xFFFFFFFF  # type: ignore[attr-defined]  # this store's

        def part_two_waits() -> bool:
            with psycopg.connect(url.split("?")[0], autocommit=True) as look:
                waiting = (
                    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND classid::bigint = %s"
                )
                return look.execute(waiting, (space,)).fetchone() is not None

        _close_waits_for_part_two(q, part_two_waits, visit.commit)


def _native_visit_requeues_later(q: Quick, zone: ZoneId) -> Iterator[None]:
    """A native visit's transaction, held open: the zone's pointer locked and requeued
    an hour later (the zone read before an application's COMMIT), committed when the
    generator resumes."""
    from quickzones.store.sql.connections import SQLTransaction

    with q.kv.sql_write() as c:  # type: ignore[attr-defined]
        native = SQLTransaction(c, q.kv)  # type: ignore[arg-type]
        _requeue_an_hour_later(q, zone, native, q.toplevel.get_pointer(zone))  # type: ignore[arg-type]
        yield


def _requeue_an_hour_later(q: Quick, zone: ZoneId, tr: Any, pointer: Any) -> None:
    """A visit's requeue in ``tr`` that read ``zone`` before an application's COMMIT:
    ``pointer`` back an hour later than it vests."""
    assert pointer is not None
    later = pointer.vesting_ms + 3_600_000
    requeued = q.toplevel.requeue_pointer(
        pointer, lambda t: later, lambda t: False, min_inactive_ms=3_600_000, active=True, tr=tr
    )
    assert requeued == "requeued"


def _pulled_back_and_run(q: Quick, zone: ZoneId, ran: list[str]) -> None:
    """Part two pulled ``zone``'s pointer back to the new item, and both items run."""
    now = time.time() * 1000
    assert wait_for(
        lambda: (p := q.toplevel.get_pointer(zone)) is not None and p.vesting_ms <= now, 10
    ), q.toplevel.get_pointer(zone)
    assert wait_for(lambda: q.run_until_idle() >= 0 and sorted(ran) == ["earlier", "z"], 10)


def _close_waits_for_part_two(q: Quick, waits: Any, end_visit: Any) -> None:
    """With part two under way (``waits`` says so), ``q.close()`` returns only once the
    visit it waits for ends (``end_visit``) and part two has run."""
    assert wait_for(waits, 10)
    closing = threading.Thread(target=q.close, daemon=True)
    closing.start()
    closing.join(1.0)
    assert closing.is_alive(), "close() returned while part two was under way"
    end_visit()
    closing.join(10)
    assert not closing.is_alive()
    running = [t for t in threading.enumerate() if t.name == "quick-pg-after-commit"]
    assert not any(t.is_alive() for t in running)


def _sql_url(kv_url: str) -> str:
    return kv_url + "&zones=sql"


def test_part_two_sees_the_pointer_a_native_visit_committing_meanwhile_moved(
    native: Native,
) -> None:
    """zones=sql: as the KV test above. A visit that read the zone before the request's
    COMMIT requeues the pointer past the new item and commits after that COMMIT; part
    two, after the COMMIT, waits for the visit's lock on the pointer and then pulls it
    back to the item."""
    q = native.q
    zone = ZoneId("shop", "z")
    q.enqueue("job", {"tenant": "earlier"}, app="shop", tenant="z")
    held = OpenRequest(q, native.url, "z")
    visit = _native_visit_requeues_later(q, zone)
    next(visit)
    held.commit()
    time.sleep(0.5)  # part two waits for the visit meanwhile
    with contextlib.suppress(StopIteration):
        next(visit)
    _pulled_back_and_run(q, zone, native.ran)


def test_close_waits_for_a_native_part_two_under_way(kv_url: str) -> None:
    """zones=sql: as the KV test above, part two waiting for a visit's lock on the
    pointer; close() returns only once it has run."""
    url = _sql_url(kv_url)
    q = Quick.open(url)
    q.job("job")(lambda payload, ctx: None)
    zone = ZoneId("shop", "z")
    q.enqueue("job", {"tenant": "earlier"}, app="shop", tenant="z")
    held = OpenRequest(q, url, "z")
    visit = _native_visit_requeues_later(q, zone)
    next(visit)
    held.commit()  # part two now waits for the visit's commit

    def part_two_waits() -> bool:
        with psycopg.connect(url.split("?")[0], autocommit=True) as look:
            waiting = (
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            return look.execute(waiting).fetchone() is not None

    def end_visit() -> None:
        with contextlib.suppress(StopIteration):
            next(visit)

    _close_waits_for_part_two(q, part_two_waits, end_visit)
