"""A visit holds back only the room of what it leased, once it knows.

Each visit claims room in the consumer's bound before it leases (paper Algorithm 1, line
5), and a visit may take more than there are workers (``dequeue_max`` 10 against 8
workers), so one visit claimed all the free room. It kept it to its very end: an item
enqueued into another zone meanwhile waited for that visit to end, behind its commit and
its hand-out, which under load took tens of milliseconds (issue 42's pickup tail)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.conftest import store_url
from tests.waiting import wait_for


def _url(store: str, tmp_path: Path) -> str:
    if store == "postgres-sql":
        reason = postgres_skip_reason()
        if reason is not None:
            pytest.skip(reason)
        return store_url("postgres", tmp_path) + "&zones=sql"
    if store == "sqlite-sql":
        return store_url("sqlite", tmp_path) + "?zones=sql"
    return store_url(store, tmp_path)


def _recording(q: Quick) -> dict[str, float]:
    """Each zone's first start, as the handler of ``job`` records it."""
    started: dict[str, float] = {}
    lock = threading.Lock()

    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        with lock:
            started.setdefault(payload["zone"], time.monotonic())

    return started


def _another_zone_starts_meanwhile(
    q: Quick, started: dict[str, float], held: str, release: Callable[[], object]
) -> None:
    """While ``held``'s visit is held up, an item enqueued into another zone starts at
    once; ``held``'s own starts once ``release`` ran."""
    q.enqueue("job", {"zone": "other"}, app="a", tenant="other")
    assert wait_for(lambda: "other" in started, 5), f"waited behind the visit of {held!r}"
    assert held not in started
    release()
    assert wait_for(lambda: held in started, 10)


@pytest.mark.parametrize("store", ["memory", "sqlite", "sqlite-sql", "postgres-sql"])
def test_a_slow_visit_keeps_no_other_zones_item_waiting(tmp_path: Path, store: str) -> None:
    """A visit held up after its transaction's reads (here by the observer it reports its
    lease to, as a slow metrics sink would) keeps back only the one item it leased: an
    item enqueued into another zone meanwhile starts at once, with the defaults."""
    q = Quick.open(_url(store, tmp_path))
    started = _recording(q)
    release = threading.Event()

    def observer(event: str, fields: dict[str, Any]) -> None:
        if event == "pointer_leased" and fields["zone"].tenant == "slow":
            release.wait(30)

    q.enqueue("job", {"zone": "slow"}, app="a", tenant="slow")
    consumer = q.consumer(ConsumerConfig(), observer=observer)
    consumer.start()
    try:
        time.sleep(0.5)  # the slow zone's visit is held in the observer
        assert not started
        _another_zone_starts_meanwhile(q, started, "slow", release.set)
    finally:
        release.set()
        consumer.stop()
        q.close()


def test_a_visit_waiting_on_a_row_lock_keeps_no_other_zones_item_waiting(
    tmp_path: Path,
) -> None:
    """PostgreSQL with zones=sql: a visit whose write of its item's lease waits for a
    row lock an application holds on that item keeps back only that item: its dequeue
    tells what it leases as soon as it decided, before the write that waits."""
    import psycopg

    url = _url("postgres-sql", tmp_path)
    schema = url.split("schema=")[1].split("&")[0]
    q = Quick.open(url)
    started = _recording(q)

    q.enqueue("job", {"zone": "locked"}, app="a", tenant="locked")
    app = psycopg.connect(url.split("?")[0])
    app.execute(f"SELECT 1 FROM {schema}.quick_items FOR UPDATE")  # held until rollback
    consumer = q.consumer(ConsumerConfig())
    consumer.start()
    try:
        with psycopg.connect(url.split("?")[0], autocommit=True) as watch:
            waits = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            assert wait_for(lambda: watch.execute(waits).fetchone()[0] > 0, 10)  # type: ignore[index]
        _another_zone_starts_meanwhile(q, started, "locked", app.rollback)
    finally:
        app.close()
        consumer.stop()
        q.close()
