"""Batched visits (``ConsumerConfig.visits_per_transaction``): a manager visits several of
the zones a scan selected in one transaction (with ``one_transaction_visits``).

The complaint it answers: many small tenants, each with an item now and then, cost the
store a visit (a commit) per item, and while a noisy tenant drains those commits queue on
the store's write lock and the small tenants' items wait. What a user relies on must not
change with it: every item runs once, each zone still gives at most ``dequeue_max`` per
visit (invariant 7), the consumer never holds more than ``processing_bound``, a pointer it
cannot lease, routing, job-type caps and app limits hold, and a batch that conflicts or
fails leaves nothing leased behind it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ConfigurationError, StorageError
from quickzones.store.limits import AppLimits
from quickzones.store.records import WorkItem, ZoneId

# A bound above a batch's 8 x 2 items: the batch, not the bound, is what is measured.
BATCH = ConsumerConfig(
    in_order=True,
    dequeue_max=2,
    visit_max=2,  # the paper's visits: at most dequeue_max
    one_transaction_visits=True,
    visits_per_transaction=8,
    processing_bound=32,
)


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        self.seen.append((event, fields))

    def count(self, name: str) -> int:
        return sum(1 for event, _ in self.seen if event == name)

    def fields(self, name: str) -> list[dict[str, Any]]:
        return [f for event, f in self.seen if event == name]


def _read_version(q: Quick) -> int:
    tr = q.kv.create_transaction()
    try:
        return int(tr.get_read_version())
    finally:
        tr.cancel()


def _enqueue_spread(q: Quick, zones: int, per_zone: int, app: str = "app") -> list[str]:
    return [
        q.enqueue("j", n, app=app, tenant=f"t{z}") for z in range(zones) for n in range(per_zone)
    ]


def test_one_commit_visits_every_selected_zone(q: Quick, backend: str) -> None:
    ran: Counter[str] = Counter()
    q.job("j")(lambda payload, ctx: ran.update([ctx.item_id]))
    ids = _enqueue_spread(q, zones=6, per_zone=3)
    events = _Events()
    consumer = q.consumer(BATCH, observer=events)
    refs = consumer.scan_once()
    assert len(refs) == 6
    before = _read_version(q)

    works = consumer.visit_many(refs)

    if backend != "fdb":  # a real cluster's versions advance with time
        assert _read_version(q) - before == 1
    per_zone = Counter(w.zone for w in works)
    assert len(per_zone) == 6 and set(per_zone.values()) == {2}  # dequeue_max each
    assert events.fields("visits_batched") == [{"zones": 6, "items": 12}]
    # Requeued in the same commit at each zone's minimum vesting time: one item left in each.
    assert {r.pointer_id for r in consumer.scan_once()} == {r.pointer_id for r in refs}
    for w in works:
        consumer.execute(w)
    consumer.flush_completions()
    consumer.run_until_idle()
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}


def test_many_zones_drain_once_each_in_batches(q: Quick) -> None:
    ran: Counter[str] = Counter()
    q.job("j")(lambda payload, ctx: ran.update([ctx.item_id]))
    ids = [q.enqueue("j", n, app="app", tenant=f"t{n % 23}") for n in range(100)]
    events = _Events()
    consumer = q.consumer(BATCH, observer=events)
    consumer.run_until_idle()
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}
    assert all(f["items"] <= 2 for f in events.fields("visited"))
    assert max(f["zones"] for f in events.fields("visits_batched")) == 8
    assert events.count("pointer_leased") == events.count("visited")


def test_a_batch_takes_no_more_than_the_free_capacity(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    _enqueue_spread(q, zones=4, per_zone=3)
    config = ConsumerConfig(
        in_order=True,
        dequeue_max=2,
        processing_bound=5,
        one_transaction_visits=True,
        visits_per_transaction=8,
    )
    consumer = q.consumer(config)
    refs = consumer.scan_once()
    works = consumer.visit_many(refs)
    assert len(works) == 5 and consumer.in_flight() == 5
    # The zones the batch had no room for were not leased: vested for the next scan.
    untouched = {r.pointer_id for r in refs} - {
        q.toplevel.get_pointer(w.zone).pointer_id  # type: ignore[union-attr]
        for w in works
    }
    assert untouched and untouched <= {r.pointer_id for r in consumer.scan_once()}


def test_a_pointer_leased_elsewhere_does_not_stop_the_others(q: Quick, backend: str) -> None:
    q.job("j")(lambda payload, ctx: None)
    _enqueue_spread(q, zones=3, per_zone=1)
    events = _Events()
    a = q.consumer(BATCH, name="a", observer=events)
    b = q.consumer(ConsumerConfig(in_order=True), name="b")
    refs = a.scan_once()
    held = b.visit(refs[0])  # b holds that zone's item now, its pointer requeued later
    assert len(held) == 1
    before = _read_version(q)

    works = a.visit_many(refs)

    assert {w.zone for w in works} == {ZoneId("app", f"t{z}") for z in range(3)} - {held[0].zone}
    assert len(works) == 2
    if backend != "fdb":
        assert _read_version(q) - before == 1
    assert events.fields("visits_batched") == [{"zones": 2, "items": 2}]
    assert events.fields("pointer_lease_failed") == [{"reason": "moved"}]


@pytest.mark.parametrize("races", [1, 2])
def test_a_conflicting_batch_is_tried_again_then_visits_each_zone(q: Quick, races: int) -> None:
    """An enqueue into one of the batch's zones commits while the batch's transaction is
    open. Once: the batch runs again at once and takes that item too. Twice: the batch
    commits nothing and each zone is visited on its own. Either way every item, the racing
    ones included, is handed out once."""
    q.job("j")(lambda payload, ctx: None)
    first = _enqueue_spread(q, zones=3, per_zone=1)
    events = _Events()
    config = ConsumerConfig(in_order=True, one_transaction_visits=True, visits_per_transaction=8)
    consumer = q.consumer(config, observer=events)
    default_accept = consumer.manager.accept_factory
    raced: list[str] = []

    first_zone: list[int] = []

    def racing_accept(reserved: dict[str, str]) -> Any:
        # Called as a transaction starts dequeueing a zone (each zone keeps its own map
        # across tries): the enqueue lands inside the transaction, once per try.
        first_zone[:] = first_zone or [id(reserved)]
        if id(reserved) == first_zone[0] and len(raced) < races:
            raced.append(q.enqueue("j", 9, app="app", tenant="t1"))
        return default_accept(reserved)

    consumer.manager.accept_factory = racing_accept
    works = consumer.visit_many(consumer.scan_once())

    assert events.count("one_transaction_visit_conflict") == races
    assert events.count("visits_batched") == (1 if races == 1 else 0)
    ids = [w.item.item_id for w in works]
    assert sorted(ids) == sorted([*first, *raced])
    assert consumer.in_flight() == 3 + races
    # Counted once each: the written-off transactions' dequeues left no count behind.
    assert consumer.manager.in_flight.per_type["j"] == 3 + races
    # A batch does not know which zone conflicted: none is held to three transactions,
    # and each zone's own visit after two losses committed in one.
    gate = consumer.manager.one_transaction
    assert all(gate.try_one(w.pointer_key) for w in works)


def test_a_failed_batch_leaves_nothing_leased(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    ids = _enqueue_spread(q, zones=3, per_zone=1)
    consumer = q.consumer(BATCH)

    def failing_accept(reserved: dict[str, str]) -> Any:
        def accept(item: WorkItem) -> bool:
            raise StorageError("disk went away")

        return accept

    consumer.manager.accept_factory = failing_accept
    refs = consumer.scan_once()
    with pytest.raises(StorageError, match="disk went away"):  # the scanner backs off on it
        consumer.visit_many(refs)
    assert {r.pointer_id for r in consumer.scan_once()} == {r.pointer_id for r in refs}
    for z, item_id in enumerate(ids):
        item = q.items.get(ZoneId("app", f"t{z}"), item_id)
        assert item is not None and item.lease_id is None and item.attempts == 0
    assert consumer.in_flight() == 0


def test_an_app_with_dispatch_limits_keeps_its_cap_in_a_batch(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.set_limits("capped", AppLimits(max_concurrency=1))
    for n in range(3):
        q.enqueue("j", n, app="capped", tenant="c")
    _enqueue_spread(q, zones=2, per_zone=2)
    consumer = q.consumer(BATCH)
    works = consumer.visit_many(consumer.scan_once())
    per_app = Counter(w.zone.app for w in works)
    assert per_app == {"capped": 1, "app": 4}


def test_a_job_type_cap_holds_across_the_zones_of_a_batch(q: Quick) -> None:
    q.job("limited", max_concurrency=2)(lambda payload, ctx: None)
    for z in range(3):
        # The same item id in every zone: each zone's reservation is its own.
        q.enqueue("limited", z, app="app", tenant=f"t{z}", item_id="same")
        q.enqueue("limited", z, app="app", tenant=f"t{z}")
    consumer = q.consumer(BATCH)
    works = consumer.visit_many(consumer.scan_once())
    assert len(works) == 2
    assert consumer.manager.in_flight.per_type["limited"] == 2


def test_routing_skips_other_apps_zones_in_a_batch(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", 1, app="other", tenant="t1")
    mine = q.enqueue("j", 1, app="mine", tenant="t1")
    routed = ConsumerConfig(
        in_order=True, one_transaction_visits=True, visits_per_transaction=4, apps=("mine",)
    )
    consumer = q.consumer(routed)
    refs = q.consumer(BATCH).scan_once()  # both apps' pointers, as an unrouted scan sees
    works = consumer.visit_many(refs)
    assert [w.item.item_id for w in works] == [mine]
    assert len(q.consumer(BATCH).scan_once()) == 1  # the other app's pointer still vested


def test_a_running_consumer_batches_and_runs_every_item_once(real_q: Quick) -> None:
    q = real_q
    ran: Counter[str] = Counter()
    q.job("j")(lambda payload, ctx: ran.update([ctx.item_id]))
    ids = [q.enqueue("j", n, app="app", tenant=f"t{n % 40}") for n in range(120)]
    events = _Events()
    config = ConsumerConfig(
        dequeue_max=2,
        one_transaction_visits=True,
        visits_per_transaction=8,
        idle_sleep_s=0.005,
        selection_frac=1.0,
        selection_max=32,
    )
    consumer = q.consumer(config, observer=events)
    consumer.start()
    try:
        deadline = time.monotonic() + 30
        while sum(ran.values()) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        consumer.stop()
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}
    assert max(f["zones"] for f in events.fields("visits_batched")) > 1


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"visits_per_transaction": 0}, "visits_per_transaction must be an integer of at least 1"),
        ({"visits_per_transaction": 2.5}, "visits_per_transaction must be an integer"),
    ],
)
def test_bad_batch_settings_are_refused(over: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"one_transaction_visits": True, **over}
    with pytest.raises(ConfigurationError, match=message):
        ConsumerConfig(**settings).validate()


def test_three_transaction_visits_take_one_zone_each() -> None:
    """Turning one-transaction visits off needs nothing else changed: the batch size of
    the default applies only to one-transaction visits."""
    config = ConsumerConfig(one_transaction_visits=False)
    config.validate()
    assert config.visits_per_transaction == 4 and config.visits_at_once() == 1
    assert ConsumerConfig().visits_at_once() == 4
