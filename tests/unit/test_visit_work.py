"""The Python work a scan and a visit do per pointer and per item (issue 40 point 9): in
``quick demo`` a small tenant's new item waits, under the GIL, behind the visits of the
noisy one, so what a scan or a visit repeats for each pointer or item is paid in every
small tenant's pickup. Counted here, not timed (``bench.demo_pickup`` times it)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.weighing import Weighing
from quickzones.store.records import ZoneId
from quickzones.store.weights import Weights
from tests.scanner_alone import scanner_alone

TENANTS = 12


class CountedWeights(Weights):
    """The store's weights, each zone's lookup counted."""

    def __init__(self, inner: Weights) -> None:
        super().__init__(inner.kv, inner.keys, inner.clock)
        self.lookups: Counter[ZoneId] = Counter()

    def of_zone(self, zone: ZoneId) -> float | None:
        self.lookups[zone] += 1
        return super().of_zone(zone)


def test_a_scan_looks_each_pointers_weight_up_once(q: Quick) -> None:
    """Before: three lookups per vested pointer a scan peeked (passing over zones that
    hold enough, the weighted sample, the water-filling order); its docstring promised
    that a scan's weighing costs what it peeked."""
    q.set_weight("app", None, 2)
    zones = [ZoneId("app", f"t{i:02d}") for i in range(TENANTS)]
    for zone in zones:
        q.enqueue("job", b"", app=zone.app, tenant=zone.tenant)
    weights = CountedWeights(q.tenant_weights)
    pointers = [q.toplevel.get_pointer(zone) for zone in zones]
    by_id = {p.pointer_id: p.zone for p in pointers if p is not None}
    events: list[tuple[str, dict[str, Any]]] = []
    scanner = scanner_alone(
        q,
        ConsumerConfig(selection_max=4, selection_frac=1.0),
        in_order=False,
        capacity=100,
        emit=lambda event, **fields: events.append((event, fields)),
        weighing=Weighing(lambda *a, **k: None, weights),
        zone_of=lambda key: by_id.get(key[2]),
    )
    chosen = scanner.scan_once()
    assert len(chosen) == 4
    assert set(weights.lookups) == set(zones)
    assert max(weights.lookups.values()) == 1, weights.lookups


def test_a_started_items_record_is_decoded_once_its_completion_reads_it_as_kept(
    q: Quick,
) -> None:
    """The record a lease wrote is kept by the store (tests/unit/
    test_leased_record_read_back.py); before, the worker's start check took it back, so
    the completion's read decoded the record again: two decodes an item where one does.
    The start check leaves it, so every read up to the completion finds the item the
    lease returned, not a copy decoded again."""
    zone = ZoneId("app", "t")
    q.enqueue("job", b"x", app=zone.app, tenant=zone.tenant)
    (leased,), _ = q.zones.dequeue(zone, 1, 60_000)
    lease_id = str(leased.lease_id)
    assert q.zones.start(zone, leased.item_id, lease_id) is leased
    assert q.zones.start(zone, leased.item_id, lease_id) is leased  # as the completion reads
    assert q.zones.complete_many(zone, [(leased.item_id, lease_id)]) == [None]
    assert q.zones.get(zone, leased.item_id) is None and q.zones.count(zone) == 0
