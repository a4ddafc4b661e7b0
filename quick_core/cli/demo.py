"""``quick demo``: many small tenants and one noisy tenant sharing one consumer.

Producers enqueue for ``duration_s`` seconds; the noisy tenant sends ``noisy_factor``
times the rate of each small tenant and starts with a backlog. A consumer runs the items;
each handler records its pickup latency (enqueue to start). The closing table shows that
the small tenants are served promptly whatever the noisy one does: that is the per-tenant
fairness QuiCK's zones and pointers give.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.events import Observer
from quickzones.registry import JobContext

NOISY = "noisy"


@dataclass(slots=True)
class DemoConfig:
    store: str | None = None
    tenants: int = 20
    noisy_factor: int = 100
    rate: float = 5.0
    duration_s: float = 20.0
    work_ms: float = 2.0
    workers: int = 8
    seed: int = 1
    drain_timeout_s: float = 30.0
    # Where to write every item's pickup (ms) as JSON, {"small": [...], "noisy": [...]}:
    # runs pooled say more about the tail than one run's p99 (bench.demo).
    pickups: str | None = None


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def run_demo(
    cfg: DemoConfig, console: Console | None = None, observer: Observer | None = None
) -> bool:
    """Run the demo; ``observer`` hears the consumer's events (``bench.demo_pickup`` splits
    each pickup with them)."""
    console = console or Console()
    tmpdir = None
    store = cfg.store
    if store is None:
        tmpdir = tempfile.mkdtemp(prefix="quick-demo-")
        store = f"sqlite:///{os.path.join(tmpdir, 'demo.db')}"
    q = Quick.open(store)
    latencies: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()
    enqueued: dict[str, int] = defaultdict(int)
    work_s = cfg.work_ms / 1000

    @q.job("demo.work")
    def work(payload: Any, ctx: JobContext) -> None:
        started = time.time()
        with lock:
            latencies[ctx.tenant].append(started * 1000 - ctx.item.enqueued_ms)
        if work_s:
            time.sleep(work_s)

    small = [f"tenant-{i:02d}" for i in range(cfg.tenants)]
    rng = random.Random(cfg.seed)
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer(tenants: list[str], rate: float, seed: int) -> None:
        """Poisson arrivals at ``rate`` per tenant, for all ``tenants`` from one thread:
        few threads keep the producers from competing with the consumer for the GIL."""
        r = random.Random(seed)
        total_rate = rate * len(tenants)
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                tenant = r.choice(tenants)
                q.enqueue("demo.work", {"n": enqueued[tenant]}, app="demo", tenant=tenant)
                with lock:
                    enqueued[tenant] += 1
                next_at += r.expovariate(total_rate)
                stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as err:  # surfaced in the summary
            errors.append(err)

    # The noisy tenant starts with a backlog of a few seconds of its traffic.
    backlog = int(cfg.rate * cfg.noisy_factor * 3)
    for start in range(0, backlog, 500):
        n = min(500, backlog - start)
        q.enqueue_many("demo.work", [{"n": i} for i in range(n)], app="demo", tenant=NOISY)
    enqueued[NOISY] += backlog

    consumer = q.consumer(
        ConsumerConfig(
            workers=cfg.workers,
            managers=4,
            dequeue_max=4,
            selection_max=8,
            pointer_lease_s=1.0,
            idle_sleep_s=0.005,
            min_inactive_s=2.0,
            seed=cfg.seed,
        ),
        observer=observer,
    )
    consumer.start()
    threads = [
        threading.Thread(target=producer, args=(small, cfg.rate, rng.random()), daemon=True),
        threading.Thread(
            target=producer,
            args=([NOISY], cfg.rate * cfg.noisy_factor, rng.random()),
            daemon=True,
        ),
    ]
    t0 = time.time()
    for t in threads:
        t.start()

    def progress() -> Table:
        table = Table(title=f"quick demo on {store}")
        table.add_column("elapsed")
        table.add_column("enqueued")
        table.add_column("done")
        table.add_column("noisy done")
        with lock:
            done = sum(len(v) for v in latencies.values())
            total = sum(enqueued.values())
            noisy_done = len(latencies[NOISY])
        table.add_row(f"{time.time() - t0:5.1f}s", str(total), str(done), str(noisy_done))
        return table

    with Live(progress(), console=console, refresh_per_second=4, transient=True) as live:
        while time.time() - t0 < cfg.duration_s:
            time.sleep(0.25)
            live.update(progress())
        stop.set()
        for t in threads:
            t.join()
        deadline = time.time() + cfg.drain_timeout_s
        while time.time() < deadline:
            with lock:
                done = sum(len(v) for v in latencies.values())
            if done >= sum(enqueued.values()):
                break
            time.sleep(0.1)
            live.update(progress())
    consumer.stop()
    elapsed = time.time() - t0
    q.close()

    table = Table(title="pickup latency (enqueue to start), ms")
    for col in ("tenant", "enqueued", "run", "p50", "p99", "max", "p99/p50"):
        table.add_column(col, justify="right")
    ok = not errors
    worst_ratio = 0.0
    for tenant in [*small, NOISY]:
        lat = latencies[tenant]
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        ratio = p99 / max(p50, 1.0)
        if tenant != NOISY:
            worst_ratio = max(worst_ratio, ratio)
        table.add_row(
            tenant,
            str(enqueued[tenant]),
            str(len(lat)),
            f"{p50:.1f}",
            f"{p99:.1f}",
            f"{max(lat) if lat else float('nan'):.1f}",
            f"{ratio:.1f}",
        )
        if len(lat) != enqueued[tenant]:
            ok = False
    console.print(table)
    total = sum(enqueued.values())
    done = sum(len(v) for v in latencies.values())
    small_all = [x for t in small for x in latencies[t]]
    console.print(
        f"{done}/{total} items run in {elapsed:.1f}s; small tenants overall p50 "
        f"{statistics.median(small_all) if small_all else float('nan'):.1f} ms, p99 "
        f"{percentile(small_all, 99):.1f} ms; worst small-tenant p99/p50 {worst_ratio:.1f}"
    )
    for err in errors:
        console.print(f"[red]producer error: {err}[/red]")
    if done != total:
        console.print(f"[red]{total - done} items not run[/red]")
    if cfg.pickups is not None:
        with open(cfg.pickups, "w", encoding="utf-8") as out:
            json.dump({"small": [round(x, 3) for x in small_all],
                       "noisy": [round(x, 3) for x in latencies[NOISY]]}, out)  # fmt: skip
    if tmpdir is not None:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)
    return ok
