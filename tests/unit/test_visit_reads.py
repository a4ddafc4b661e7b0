"""What a visit reads beyond its items (issue 44 point 2, issue 40 point 9): with
``quick worker --workers 4`` a lone tenant's backlog drains in visits of at most four
items, so what each visit reads besides them is paid every few items.

* The pointer's requeue needs the zone's next vesting time. It read the zone's order
  index again (two range reads and their conflict ranges) right after the dequeue had
  read it; now the dequeue reads one entry more than it may take, and a vested entry
  left there is the answer (the pointer vests now).
* The settings a visit obeys (pauses, weights) were looked up part by part for each
  zone (the app's head and records, the tenant's, each under its cache's lock, each
  with a clock read); now what they combine to is remembered per app (per zone where
  the app's records name tenants) until the first head it rests on is due again.
"""

from __future__ import annotations

from collections.abc import Callable

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.store.kv import KVTransaction
from quickzones.store.pauses import REFRESH_S, Pauses
from quickzones.store.records import ZoneId

ZONE = ZoneId("app", "alone")


def _count_order_reads(q: Quick, zone: ZoneId) -> list[bytes]:
    """From now on, the begin key of each range read of ``zone``'s order index."""
    begin, end = q.keys.order_range(zone)
    reads: list[bytes] = []
    real = q.kv.create_transaction

    def counting() -> KVTransaction:
        tr = real()
        orig: Callable[..., list[tuple[bytes, bytes]]] = tr.get_range

        def get_range(b: bytes, e: bytes, *a: object, **k: object) -> list[tuple[bytes, bytes]]:
            if begin <= b < end:
                reads.append(b)
            return orig(b, e, *a, **k)

        tr.get_range = get_range  # type: ignore[method-assign]
        return tr

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    return reads


def test_a_visit_that_leaves_vested_items_reads_the_zone_order_once(q: Quick) -> None:
    """40 items in visits of 4: before, each visit read the order index three times (the
    dequeue's read, then the requeue's first entry and FIFO start); now the nine visits
    that leave vested items read it once, the last one (nothing left) as before."""
    q.job("job")(lambda payload, ctx: None)
    q.enqueue_many("job", [b""] * 40, app=ZONE.app, tenant=ZONE.tenant)
    reads = _count_order_reads(q, ZONE)
    consumer = q.consumer(ConsumerConfig(workers=4))
    assert consumer.run_until_idle() == 40
    visits = int(consumer.stats["visited"])
    assert visits == 10
    assert q.zones.count(ZONE) == 0
    # Each visit's dequeue: one read (a zone of one priority); the last visit's requeue
    # reads the (then empty) index as before; the zone's pointer collection reads it too.
    assert len(reads) <= visits + 4, reads


def test_a_visit_leaving_vested_items_requeues_the_pointer_vested(q: Quick) -> None:
    """The pointer of a zone whose visit left vested items vests at once (no later than
    the visit's end), and the pointer of a zone it emptied is requeued as before."""
    q.job("job")(lambda payload, ctx: None)
    q.enqueue_many("job", [b""] * 6, app=ZONE.app, tenant=ZONE.tenant)
    consumer = q.consumer(ConsumerConfig(workers=4))
    refs = consumer.scan_once()
    assert len(refs) == 1
    works = consumer.visit(refs[0])
    assert len(works) == 4
    pointer = q.toplevel.get_pointer(ZONE)
    assert pointer is not None and pointer.lease_id is None
    assert pointer.vesting_ms <= int(q.clock.now() * 1000)
    for w in works:
        consumer.execute(w)
    consumer.flush_completions()
    assert consumer.run_until_idle() == 2
    assert q.zones.count(ZONE) == 0


class CountingClock(ManualClock):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def now(self) -> float:
        self.reads += 1
        return super().now()


def test_a_zone_pause_lookup_is_one_clock_read_while_current() -> None:
    """A visit's (and a Worker's start check's) pause lookup for a zone: before, three
    head lookups, each with a clock read, and five cache reads under locks; now one clock
    read while what it read is current, and a change is still seen after a refresh (by
    another process) or at once (by this one)."""
    clock = CountingClock()
    q = Quick.open("memory://", clock=clock)
    try:
        pauses = Pauses(q.kv, q.keys, clock)
        zone = ZoneId("a", "t")
        assert not pauses.of_zone(zone).pauses  # read: the heads of "" and "a"
        assert not pauses.of_zone(zone).pauses  # worked out against them: remembered
        clock.reads = 0
        for _ in range(100):
            assert not pauses.of_zone(zone).pauses
            assert not pauses.of_zone(ZoneId("a", "u")).pauses
        assert clock.reads == 200
        other = Pauses(q.kv, q.keys, clock)  # another process's
        other.pause(app="a", tenant="t")
        assert not pauses.of_zone(zone).pauses  # within a refresh: not seen yet
        clock.advance(REFRESH_S)
        assert pauses.of_zone(zone).zone_paused(zone)
        assert not pauses.of_zone(ZoneId("a", "u")).zone_paused(ZoneId("a", "u"))
        pauses.resume(app="a", tenant="t")  # this process's change: at once
        assert not pauses.of_zone(zone).pauses
    finally:
        q.close()
