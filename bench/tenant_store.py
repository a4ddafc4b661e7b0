"""The tenant-scale benchmark's big store (issue 43 point 4), built through the library.

App ``a`` has ``tenants`` tenants that each had one item once, run by a job type that
always fails with ``max_attempts=1`` (so every one became a dead letter: as many dead
letters as tenants), their pointers collected once their zones were empty, so no zone
of ``a`` holds an item or a pointer. ``settings`` of those tenants then get a weight, a
tenant limit or a pause, a third each. Two ways, the same layout
(``tests/bench/test_tenant_store.py`` compares them key by key):

- ``through="store"`` (the default): each transaction of :data:`PER_STORE_TRANSACTION`
  tenants enqueues each tenant's item (``Quick.enqueue``), leases it
  (``KVZoneStore.dequeue``), dead-letters it as its holder (``KVZoneStore.dead_letter``,
  what a consumer's settler calls) and collects the emptied zone's pointer
  (:func:`quickzones.store.pointer_gc.collect_pointer_if_inactive`, what a visit calls);
  the pickups and failed runs are counted and flushed as a consumer does
  (:class:`quickzones.consumer.pickups.PickupCounts`). No consumer, no scan, no wait for
  pointers to go inactive: a million in minutes.
- ``through="consumer"``: enqueued many to a transaction (``Quick.transact``), run to
  dead letters by a consumer, pointers collected by its visits (``min_inactive_s``):
  about 93 zones a second on the shared host (3.5 hours for a million).

A SQLite file, built once per size and kept in ``.cache`` of the bench's results folder
(ignored by git; no cited run), named by the size and the git trees of the code that
writes the layout, so a change to the layout builds a new one; each run works on a copy.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, ROOT, log
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.failure import describe
from quickzones.consumer.failure_log import format_failure
from quickzones.consumer.pickups import PickupCounts
from quickzones.registry import RetryPolicy
from quickzones.store.kv import KVTransaction
from quickzones.store.pointer_gc import collect_pointer_if_inactive
from quickzones.store.records import WorkItem, ZoneId

CACHE = ROOT / "results" / ".cache"
APP = "a"
FAILS = "fails-once"
PER_TRANSACTION = 1000  # enqueues a fill transaction: well inside the 5 s lifetime, under load
# Tenants a store-built transaction takes from enqueue to collected pointer: about a
# dozen keys written and read each, well inside the 5 s lifetime under load.
PER_STORE_TRANSACTION = 250
LEASE_MS = 1000  # the consumer build's item lease (ConsumerConfig.item_lease_s)
THROUGH = ("store", "consumer")


def tenant(i: int) -> str:
    return f"t{i:07d}"


def _layout_version() -> str:
    """The git trees of the store code and the SQLite backend: a cached store is reused
    only by the code that wrote it."""
    trees = []
    for path in ("quick_core/store", "backends/sqlite"):
        done = subprocess.run(
            ["git", "rev-parse", f"HEAD:{path}"], cwd=REPO, capture_output=True, text=True
        )
        trees.append(done.stdout.strip()[:10] or "nogit")
    return "-".join(trees)


def cached(
    tenants: int, settings: int, folder: Path = CACHE, through: str = "store"
) -> tuple[Path, dict[str, Any]]:
    """The big store's file in ``folder`` (built now ``through`` either way if not there:
    the two leave the same store) and how it was had: build seconds by phase, or that it
    came from the cache."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tenants-{tenants}-settings-{settings}-{_layout_version()}.db"
    if path.exists():
        return path, {"cached": True, "file_mb": round(path.stat().st_size / 1e6, 1)}
    partial = path.with_suffix(".building")
    for stale in folder.glob(partial.name + "*"):
        stale.unlink()
    took = build(f"sqlite:///{partial}", tenants, settings, through)
    _checkpoint(partial)
    partial.rename(path)
    return path, {
        "cached": False,
        "through": through,
        "build_s": took,
        "file_mb": round(path.stat().st_size / 1e6, 1),
    }


def _checkpoint(path: Path) -> None:
    """Fold the WAL into the file, so a copy of the one file is the whole store."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


def copy_to(path: Path, folder: Path, name: str) -> str:
    """A working copy of a store file in ``folder``; returns its URL."""
    target = folder / name
    shutil.copyfile(path, target)
    return f"sqlite:///{target}"


def build(url: str, tenants: int, settings: int, through: str = "store") -> dict[str, float]:
    """Build the store at ``url`` (``through``: see the module); returns the seconds each
    phase took."""
    if through not in THROUGH:
        raise ValueError(f"through must be one of {THROUGH}, not {through!r}")
    took: dict[str, float] = {}
    q = Quick.open(url)

    @q.job(FAILS, retry=RetryPolicy(max_attempts=1))
    def fails(payload: Any, ctx: Any) -> None:
        raise RuntimeError("fails once, by design")

    try:
        if through == "store":
            q.store_type_policies()  # what a consumer stores as it starts
            took["dead_letter_s"] = _through_store(q, tenants)
            log(f"tenant store: {tenants:,} items dead-lettered in {took['dead_letter_s']} s")
        else:
            took.update(_through_consumer(q, tenants))
        started = time.perf_counter()
        for i in range(settings):
            kind = i % 3  # a third each: a weight, a tenant limit, a pause
            if kind == 0:
                q.set_weight(APP, tenant(i), 2.0)
            elif kind == 1:
                q.set_tenant_limit(APP, tenant(i), max_running=2)
            else:
                q.pause(app=APP, tenant=tenant(i))
        took["settings_s"] = round(time.perf_counter() - started, 1)
        log(f"tenant store: {settings:,} settings stored in {took['settings_s']} s")
    finally:
        q.close()
    return took


def _failure() -> tuple[str, str]:
    """The reason and bounded traceback a worker stores for the handler's failure."""
    try:
        raise RuntimeError("fails once, by design")
    except RuntimeError as err:
        return describe(err), format_failure(err)


def _through_store(q: Quick, tenants: int) -> float:
    """Each tenant's item enqueued, leased, dead-lettered by its holder and its zone's
    pointer collected, :data:`PER_STORE_TRANSACTION` tenants a transaction, with the
    library's own store functions in the order a consumer calls them; the pickups and
    failed runs counted as a consumer counts them and flushed after each transaction."""
    reason, traceback = _failure()
    cluster = q.toplevel.cluster
    counts = PickupCounts()
    started = time.perf_counter()
    for first in range(0, tenants, PER_STORE_TRANSACTION):

        def settle(tr: KVTransaction, first: int = first) -> list[tuple[ZoneId, WorkItem, int]]:
            settled = []
            for i in range(first, min(tenants, first + PER_STORE_TRANSACTION)):
                zone = ZoneId(APP, tenant(i))
                q.enqueue(FAILS, b"", app=APP, tenant=zone.tenant, tr=tr)
                leased, corrupt = q.zones.dequeue(zone, 1, LEASE_MS, tr=tr)
                if len(leased) != 1 or corrupt:
                    raise RuntimeError(f"{zone}: leased {len(leased)}, {len(corrupt)} corrupt")
                item, now = leased[0], now_ms(q.clock)
                q.zones.dead_letter(
                    zone, item.item_id, item.lease_id, reason, traceback=traceback, tr=tr
                )
                pointer = q.toplevel.get_pointer(zone, tr=tr)
                if pointer is None or not collect_pointer_if_inactive(
                    tr,
                    q.toplevel,
                    q.toplevel.shard_for(zone),
                    pointer,
                    last_active_ms=now,
                    min_inactive_ms=0,  # no consumer waits for it: the zone is empty now
                    zone_is_empty=lambda tr, zone=zone: q.zones.zone_is_empty(tr, zone),
                    now=now,
                ):
                    raise RuntimeError(f"{zone}: its pointer was not collected")
                settled.append((zone, item, now))
            return settled

        for zone, item, now in q.transact(settle):
            counts.dequeued(
                zone=zone,
                enqueued_ms=item.enqueued_ms,
                vested_ms=item.vested_ms,
                pickup_ms=now,
                cluster=cluster,
            )
            counts.ran(zone=zone, job_type=FAILS, seconds=0.0, ok=False, cluster=cluster, at_ms=now)
        counts.flush([(cluster, q.kv, q.keys)], now_ms(q.clock))
        if first and first % 100_000 == 0:
            log(f"tenant store: {first:,} tenants in {time.perf_counter() - started:.0f} s")
    return round(time.perf_counter() - started, 1)


def _through_consumer(q: Quick, tenants: int) -> dict[str, float]:
    """Enqueued many to a transaction, then run to dead letters by a consumer."""
    took: dict[str, float] = {}
    started = time.perf_counter()
    for first in range(0, tenants, PER_TRANSACTION):

        def fill(tr: KVTransaction, first: int = first) -> None:
            for i in range(first, min(tenants, first + PER_TRANSACTION)):
                q.enqueue(FAILS, b"", app=APP, tenant=tenant(i), tr=tr)

        q.transact(fill)
    took["fill_s"] = round(time.perf_counter() - started, 1)
    log(f"tenant store: {tenants:,} tenants' items enqueued in {took['fill_s']} s")
    took["drain_s"] = _dead_letter_all(q, tenants)
    log(f"tenant store: drained to dead letters, pointers collected in {took['drain_s']} s")
    return took


def _dead_letter_all(q: Quick, tenants: int) -> float:
    """Run every item of app ``a`` to a dead letter and collect every pointer: one
    consumer that selects many zones a scan and visits them in batches."""
    config = ConsumerConfig(
        in_order=False,
        peek_max=1000,
        selection_frac=1.0,
        selection_max=256,
        dequeue_max=1,
        managers=2,
        workers=8,
        # Items waiting for a worker hold 1 s leases: a few batches of 8 at most, so none
        # waits out its lease on a loaded host (a lapsed one was leased again, one pickup
        # more than the store build counts: a CI run's failure with a look-ahead of 512).
        processing_bound=64,
        visits_per_transaction=64,
        min_inactive_s=0.2,
        # A visit requeues the pointer at its zone's least vesting time, the leased item's
        # lease end: a short lease lets the emptied zone's pointer be collected soon.
        item_lease_s=1.0,
    )
    logging.disable(logging.ERROR)  # a traceback and a warning per dead letter, by design
    started = time.perf_counter()
    consumer = q.consumer(config)
    consumer.start()
    try:
        while consumer.stats["pointer_deleted"] < tenants:
            time.sleep(0.2)
    finally:
        consumer.stop()
        logging.disable(logging.NOTSET)
    if consumer.stats["dead_lettered"] != tenants:
        raise RuntimeError(f"{consumer.stats['dead_lettered']} dead letters, not {tenants}")
    return round(time.perf_counter() - started, 1)
