"""Core bugs the simulation found, each as a small deterministic regression test.

Invariant 10 (no vested pointer waits forever under an in-order scanner) was broken: a
backlogged zone's pointer was requeued at the zone's minimum vesting time, in the past, so
it sorted in front of every other vested pointer forever. Pointers are now requeued no
earlier than the visit, and the in-order scanner merges all shards by vesting time.
"""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.election import LocalElection
from quickzones.registry import JobContext

ZONES = 12
SELECTION_MAX = 4


def test_in_order_scanner_reaches_every_backlogged_zone() -> None:
    clock = ManualClock()
    q = Quick.open("memory://", clock=clock)
    ran: dict[str, int] = {}

    @q.job("work")
    def work(payload: object, ctx: JobContext) -> None:
        ran[ctx.tenant] = ran.get(ctx.tenant, 0) + 1

    # Twelve zones, oldest first, each holding one low-priority (1) item. The first four
    # keep receiving priority-0 work, so their old priority-1 item waits (by design) and
    # keeps their zone's minimum vesting time, and so their pointer, in the past.
    for z in range(ZONES):
        q.enqueue("work", b"", app="app", tenant=f"t{z:02d}", priority=1)
        clock.advance(0.01)
    consumer = q.consumer(
        ConsumerConfig(in_order=True, selection_max=SELECTION_MAX, dequeue_max=1),
        election=LocalElection(clock),
        name="scanner",
    )
    for _ in range(40):
        clock.advance(0.1)
        for z in range(SELECTION_MAX):
            q.enqueue("work", b"", app="app", tenant=f"t{z:02d}")
        for ref in consumer.scan_once():
            for w in consumer.visit(ref):
                consumer.execute(w)
    starved = [f"t{z:02d}" for z in range(SELECTION_MAX, ZONES) if f"t{z:02d}" not in ran]
    # 40 in-order rounds over 12 vested pointers, 4 per round: every zone had its turn.
    assert starved == [], f"never visited: {starved}"


def test_simulation_seed_8_has_no_starved_pointer() -> None:
    from quickzones.testing.simulation import run_seed

    result = run_seed(8, 2000, 0.01)
    assert [str(v) for v in result.violations] == []
