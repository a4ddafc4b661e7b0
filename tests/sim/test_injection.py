"""The simulation injects what it controls (id sources, a commit hook, zone stores) through
constructors and patches nothing in core (issue 13.7): a real Quick running in the same
process meanwhile keeps unguessable ids, and the store keeps its own commit."""

from __future__ import annotations

from typing import Any

from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.zones import KVZoneStore
from quickzones.store.zonestore import CorruptItem
from quickzones.testing.simulation import run_seed
from quickzones.testing.simulation.harness import SimConfig, Simulation

seen: list[str] = []


class Bystander(KVZoneStore):
    """While the simulation runs, an unrelated Quick in the same process enqueues."""

    def dequeue(
        self, zone: ZoneId, max_items: int, lease_ms: int, **options: Any
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        if len(seen) % 1000 < 3:
            other = Quick(MemoryStore())
            seen.append(other.enqueue("job", b"", app="a", tenant="t"))
        return super().dequeue(zone, max_items, lease_ms, **options)


def _bystander(q: Quick) -> KVZoneStore:
    return Bystander(q.kv, q.toplevel, keys=q.keys, clock=q.clock)


def test_a_run_leaves_other_quicks_ids_random() -> None:
    seen.clear()
    a = run_seed(5, 300, 0.0, zone_store=_bystander)
    first = list(seen)
    seen.clear()
    b = run_seed(5, 300, 0.0, zone_store=_bystander)
    assert a.trace_hash == b.trace_hash  # the run itself still replays
    assert first and seen
    assert set(first).isdisjoint(seen), "a bystander's ids followed the simulation's seed"


def test_the_store_keeps_its_own_commit() -> None:
    sim = Simulation(SimConfig(seed=1, steps=50))
    assert "_commit" not in vars(sim.store)
    assert sim.run().ok
