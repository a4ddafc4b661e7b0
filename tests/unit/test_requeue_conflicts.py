"""A pointer requeue reads the zone's earliest vesting time with conflicts (paper
Algorithm 2's last transaction). It must conflict with a commit that adds an item vesting
earlier than what it read, or the pointer could be requeued after that item, and it need
not conflict with the consumer's own completions of leased items, which in a busy zone
come all the time: every such conflict threw away a one-transaction visit (measured on
FoundationDB, bench/results/20261124T043017Z-fdb-visits)."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import NOT_COMMITTED, KVError
from quickzones.store.records import ZoneId

Z = ZoneId("app", "t1")
LEASE_MS = 30_000


def leased_zone(q: Quick) -> list[str]:
    """A zone whose two items are both leased (keyed by their lease ends)."""
    q.enqueue("j", b"", app="app", tenant="t1")
    q.enqueue("j", b"", app="app", tenant="t1")
    items, _ = q.zones.dequeue(Z, 10, LEASE_MS)
    assert len(items) == 2
    return [i.item_id for i in items]


def requeue_reading_min(q: Quick) -> tuple[object, int | None]:
    tr = q.kv.create_transaction()
    earliest = q.zones.min_vesting_ms(Z, tr=tr)
    tr.set(b"requeue-marker", b"1")  # a write, as the requeue's pointer move
    return tr, earliest


def test_a_completion_of_a_leased_item_does_not_conflict_with_the_requeue(
    q: Quick, clock: ManualClock
) -> None:
    ids = leased_zone(q)
    tr, earliest = requeue_reading_min(q)
    assert earliest == int(clock.now() * 1000) + LEASE_MS
    held = q.zones.get(Z, ids[0])
    assert held is not None and held.lease_id is not None
    q.zones.complete(Z, ids[0], held.lease_id)  # a worker finishing, meanwhile
    tr.commit()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "options",
    [{"priority": 0}, {"priority": 5}, {"priority": -3}, {"fifo": True}],
    ids=["priority-present", "priority-absent", "priority-lower", "fifo"],
)
def test_an_item_vesting_earlier_conflicts_with_the_requeue(
    q: Quick, clock: ManualClock, options: dict[str, Any]
) -> None:
    leased_zone(q)
    tr, _ = requeue_reading_min(q)
    # Vested now, before both leases end: in a priority present or not, keyed by vesting
    # time or FIFO.
    q.enqueue("j", b"", app="app", tenant="t1", **options)
    with pytest.raises(KVError) as err:
        tr.commit()  # type: ignore[attr-defined]
    assert err.value.code == NOT_COMMITTED


def test_an_empty_zone_conflicts_with_any_enqueue(q: Quick, clock: ManualClock) -> None:
    item_id = q.enqueue("j", b"", app="app", tenant="t1", delay=60)
    q.cancel("app", "t1", item_id)
    tr, earliest = requeue_reading_min(q)
    assert earliest is None
    q.enqueue("j", b"", app="app", tenant="t1", delay=120)
    with pytest.raises(KVError) as err:
        tr.commit()  # type: ignore[attr-defined]
    assert err.value.code == NOT_COMMITTED
