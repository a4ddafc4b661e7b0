"""The deterministic simulation in CI: many seeds under faults, replayability, and proof
that the checker catches broken invariants (mutant zone stores)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.errors import ItemNotFound
from quickzones.store.kv import OWN_STORE, KVTransaction
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.zones import KVZoneStore
from quickzones.store.zonestore import CorruptItem
from quickzones.testing.simulation import SimResult, run_seed
from quickzones.testing.simulation.cli import main, replay_command

# Each run sweeps 80 seeds: 0 to 29 every time, and 50 more that move on each day (UTC),
# so that CI, run every session, goes on covering new seeds rather than 200 fixed ones
# (8 minutes of a 2-core CI run, its longest file; 100 seeds were 4). A failure names its
# seed and the command that replays it.
FIXED_SEEDS = 30
DAILY_SEEDS = 50
# Every seed, each run half as long with twice the fault rate: about as many faults of each
# kind per seed as 2,000 steps at 1 % (not_committed ~30, too_old ~33, unknown results ~15
# each), in a third of the time (the store, the checker's scans and the drain at quiescence
# grow with the run). test_heavier_faults covers 5 %.
STEPS = 1000
FAULTS = 0.02
CHUNKS = 10  # pytest params, so a failure names a small range and progress shows


def sweep_seeds(day: int) -> list[int]:
    """The seeds one run sweeps on ``day`` (days since 1970-01-01, UTC): the fixed ones,
    then that day's (from 1,000 on, a new block each day for 10,000 days)."""
    first = 1_000 + (day % 10_000) * DAILY_SEEDS
    return [*range(FIXED_SEEDS), *range(first, first + DAILY_SEEDS)]


SEEDS = sweep_seeds(int(time.time() // 86_400))


# Violation kinds of open core bugs, each demonstrated in test_core_bugs.py (strict xfail)
# and reported; the sweep tolerates only these. Remove an entry when its bug is fixed.
KNOWN_CORE_BUGS: frozenset[str] = frozenset()


def _unexpected(r: SimResult) -> bool:
    return any(v.kind not in KNOWN_CORE_BUGS for v in r.violations)


def _report(results: Sequence[SimResult]) -> str:
    lines = []
    for r in results:
        if not _unexpected(r):
            continue
        lines.append(f"seed {r.seed}: {len(r.violations)} violation(s)")
        lines.extend(f"  {v}" for v in r.violations[:5])
        lines.append(f"  replay: {replay_command(r.seed, r.steps, r.faults)}")
    return "\n".join(lines)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeds_under_faults(chunk: int) -> None:
    per = len(SEEDS) // CHUNKS
    results = [run_seed(seed, STEPS, FAULTS) for seed in SEEDS[chunk * per : (chunk + 1) * per]]
    assert not any(_unexpected(r) for r in results), _report(results)
    assert sum(r.lost for r in results) == 0
    # The run must actually exercise what it claims to.
    assert sum(r.enqueued for r in results) > per * 300
    assert sum(r.dead_lettered for r in results) > 0
    faults = {k: sum(r.fault_counts[k] for r in results) for k in results[0].fault_counts}
    for kind in (
        "not_committed",
        "unknown_result_applied",
        "unknown_result_not_applied",
        "too_old",
    ):
        assert faults[kind] > 0, faults


def test_same_seed_same_run() -> None:
    a = run_seed(1234, 800, 0.02)
    b = run_seed(1234, 800, 0.02)
    assert a.trace_hash == b.trace_hash
    assert a.fault_counts == b.fault_counts
    assert run_seed(1235, 800, 0.02).trace_hash != a.trace_hash


def test_heavier_faults() -> None:
    results = [run_seed(seed, 1000, 0.05) for seed in range(1000, 1010)]
    assert not any(_unexpected(r) for r in results), _report(results)


# --- the checker bites -----------------------------------------------------------------


class DroppingZoneStore(KVZoneStore):
    """Every 25th dequeue silently deletes one of the items it leased: a lost item."""

    calls = 0

    def dequeue(
        self, zone: ZoneId, max_items: int, lease_ms: int, **options: Any
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        items, corrupt = super().dequeue(zone, max_items, lease_ms, **options)
        DroppingZoneStore.calls += 1
        if items and DroppingZoneStore.calls % 25 == 0 and items[0].delivery != "at_most_once":
            victim = items.pop(0)
            # A commit_unknown_result retry may find it already gone. Inside a visit's
            # own transaction (one-transaction and batched visits) the item goes with it.
            tr = options.get("tr")
            with contextlib.suppress(ItemNotFound):
                if tr is None:
                    self.complete(zone, victim.item_id, victim.lease_id)
                else:
                    self.complete(zone, victim.item_id, victim.lease_id, tr=tr)
        return items, corrupt


class EagerGcZoneStore(KVZoneStore):
    """Tells the pointer GC every zone is empty: pointers of non-empty zones get deleted
    (breaks invariant 1)."""

    def min_vesting_ms(self, zone: ZoneId, *, tr: KVTransaction = OWN_STORE) -> int | None:
        return None

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        return True


class NewestFirstZoneStore(KVZoneStore):
    """Hands out FIFO items newest commit first: breaks commit order."""

    def _vested_entries(
        self, tr: KVTransaction, zone: ZoneId, max_items: int, now: int, *, snapshot: bool
    ) -> list[tuple[bytes, str, int | None]]:
        entries = super()._vested_entries(tr, zone, max_items, now, snapshot=snapshot)
        fifo = [e for e in entries if e[2] is None]
        rest = [e for e in entries if e not in fifo]
        return rest + fifo[::-1]


def _mutant(cls: type[KVZoneStore]) -> Any:
    def make(q: Quick) -> KVZoneStore:
        return cls(q.kv, q.toplevel, keys=q.keys, clock=q.clock)

    return make


def test_checker_catches_dropped_items() -> None:
    r = run_seed(7, 1500, 0.01, zone_store=_mutant(DroppingZoneStore))
    assert r.lost > 0
    assert any(v.kind == "item_lost" for v in r.violations)


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_checker_catches_zone_without_pointer(seed: int) -> None:
    # Several seeds: whether one schedule ever collects a non-empty zone's pointer moves
    # with the consumer's rules (seed 7 stopped doing so when the one-transaction gate's
    # hold became a stretch of time; seed 1 when every third consumer became a pull
    # consumer, issue 40); the checker must flag it wherever it happens.
    r = run_seed(seed, 1500, 0.01, check_every=5, zone_store=_mutant(EagerGcZoneStore))
    kinds = {v.kind for v in r.violations}
    assert "zone_without_pointer" in kinds, kinds


def test_checker_catches_fifo_items_out_of_commit_order() -> None:
    r = run_seed(7, 1500, 0.01, zone_store=_mutant(NewestFirstZoneStore))
    assert any(v.kind == "fifo_order" for v in r.violations), r.violations[:3]


def test_cli_reports_replay_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "3", "--steps", "300"]) == 0
    out = capsys.readouterr().out
    assert "1 seeds x 300 steps" in out and "lost=0" in out
