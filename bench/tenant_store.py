"""The tenant-scale benchmark's big store (issue 43 point 4), built through the public API.

App ``a`` has ``tenants`` tenants that each had one item once: enqueued many to a
transaction (``Quick.transact``), run by a consumer with a job type that always fails
with ``max_attempts=1`` (so every one became a dead letter: as many dead letters as
tenants), and their pointers collected once their zones were empty (``min_inactive_s``),
so no zone of ``a`` holds an item or a pointer. ``settings`` of those tenants then get a
weight, a tenant limit or a pause, a third each.

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
from quickzones.consumer import ConsumerConfig
from quickzones.registry import RetryPolicy
from quickzones.store.kv import KVTransaction

CACHE = ROOT / "results" / ".cache"
APP = "a"
FAILS = "fails-once"
PER_TRANSACTION = 1000  # enqueues a fill transaction: well inside the 5 s lifetime, under load


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


def cached(tenants: int, settings: int, folder: Path = CACHE) -> tuple[Path, dict[str, Any]]:
    """The big store's file in ``folder`` (built now if not there) and how it was had:
    build seconds by phase, or that it came from the cache."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tenants-{tenants}-settings-{settings}-{_layout_version()}.db"
    if path.exists():
        return path, {"cached": True, "file_mb": round(path.stat().st_size / 1e6, 1)}
    partial = path.with_suffix(".building")
    for stale in folder.glob(partial.name + "*"):
        stale.unlink()
    took = build(f"sqlite:///{partial}", tenants, settings)
    _checkpoint(partial)
    partial.rename(path)
    return path, {"cached": False, "build_s": took, "file_mb": round(path.stat().st_size / 1e6, 1)}


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


def build(url: str, tenants: int, settings: int) -> dict[str, float]:
    """Build the store at ``url``; returns the seconds each phase took."""
    took: dict[str, float] = {}
    q = Quick.open(url)

    @q.job(FAILS, retry=RetryPolicy(max_attempts=1))
    def fails(payload: Any, ctx: Any) -> None:
        raise RuntimeError("fails once, by design")

    try:
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
        processing_bound=512,
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
