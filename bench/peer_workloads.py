"""The peer workloads, run identically against quick and each peer.

(i)   no-op jobs, one worker process: enqueue rate (single and the system's batch API,
      no worker running) and end-to-end rate (worker running; the producer enqueues N with
      the batch API; rate = N / (last job start - first enqueue)); what a user sees
      instead, single enqueues then a worker's spawn to the last job's end:
      :func:`enqueue_then_drain`;
(ii)  noisy neighbour: one tenant enqueues 100x as much as each of 100 small tenants; its
      share arrives as a burst at t=0 (batches of 100) while the small tenants enqueue at
      random times spread over the window; jobs sleep ``work_ms``. Enqueue-to-start p50/p99
      for the small tenants (and the noisy one);
(iii) delayed items: items requested for now + U(lo, hi) s; lateness = start - requested.
"""

from __future__ import annotations

import random
import resource
import threading
import time
from typing import Any

from bench.common import latency_summary, read_ends, read_records, wait_for_lines
from bench.peers.base import Peer

SMALL_TENANTS = 100
NOISY = "noisy"


def enqueue_rates(peer: Peer, n: int) -> dict[str, float]:
    peer.reset()
    t0 = time.perf_counter()
    for i in range(n):
        peer.enqueue(f"t{i % SMALL_TENANTS}")
    single = n / (time.perf_counter() - t0)
    peer.reset()
    t0 = time.perf_counter()
    for i in range(0, n, 100):
        peer.enqueue_batch(f"t{(i // 100) % SMALL_TENANTS}", min(100, n - i))
    batch = n / (time.perf_counter() - t0)
    peer.reset()
    return {"single": single, "batch": batch}


def end_to_end(peer: Peer, n: int, timeout_s: float = 180.0) -> float:
    peer.reset()
    peer.throughput = True
    peer.start_worker()
    try:
        peer.wait_ready()
        t0 = time.time()
        for i in range(0, n, 100):
            peer.enqueue_batch(f"t{(i // 100) % SMALL_TENANTS}", min(100, n - i))
        wait_for_lines(peer.out, n + 1, timeout_s)
        recs = [r for r in read_records(peer.out) if r.tenant != "warmup"]
        if len(recs) < n:
            return float("nan")
        return n / (max(r.start for r in recs) - t0)
    finally:
        peer.stop_worker()
        peer.throughput = False


def _children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's children that ended and were
    waited for: a worker process's, once stopped."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def enqueue_then_drain(peer: Peer, n: int, tenant: str, timeout_s: float = 300.0) -> dict[str, Any]:
    """What a user sees (:mod:`bench.peers_users`): ``n`` no-op jobs enqueued one call
    each with no worker running (the rate of those calls), then one worker process spawned
    and timed from just before its spawn to the last job's end, start-up included. Also
    the worker process's CPU seconds from its spawn to its stop (``worker_cpu_s``): on a
    shared host the rate moves with the other tenants' load, the CPU a drain costs much
    less (issue 44 point 2)."""
    peer.reset()
    t0 = time.perf_counter()
    for _ in range(n):
        peer.enqueue(tenant)
    enqueue_per_s = n / (time.perf_counter() - t0)
    peer.record_ends()
    cpu = _children_cpu_s()
    spawn = time.time()
    peer.start_worker()
    try:
        wait_for_lines(peer.out, n, timeout_s)
        wait_for_lines(peer.ends, n, timeout_s)
        starts = [r.start for r in read_records(peer.out)]
        ends = read_ends(peer.ends)
        if len(starts) < n or len(ends) < n:
            raise RuntimeError(f"{peer.name}: {len(ends)} of {n} jobs ended in {timeout_s} s")
        result: dict[str, Any] = {
            "enqueue_per_s": enqueue_per_s,
            "drain": {
                "jobs": len(ends),
                "spawn": spawn,
                "first_start": min(starts),
                "last_start": max(starts),
                "last_end": max(ends),
                "per_s": n / (max(ends) - spawn),
            },
        }
    finally:
        peer.stop_worker()
    # 0 where the worker runs in this process (memory://): no child's CPU to count.
    result["drain"]["worker_cpu_s"] = (_children_cpu_s() - cpu) or float("nan")
    return result


def noisy_neighbour(
    peer: Peer,
    per_small: int,
    window_s: float,
    work_ms: float,
    seed: int = 7,
    timeout_s: float = 180.0,
    *,
    small_tenants: int = SMALL_TENANTS,
    noisy_total: int | None = None,
    noisy_batch: int = 100,
) -> dict[str, Any]:
    """``small_tenants`` x ``per_small`` jobs at random times over ``window_s`` beside the
    noisy tenant's ``noisy_total`` (100 x ``per_small`` unless given), enqueued
    ``noisy_batch`` per call with the system's batch API, or one call per job when 1."""
    rng = random.Random(seed)
    schedule = sorted(
        (rng.uniform(0, window_s), f"t{i}") for i in range(small_tenants) for _ in range(per_small)
    )
    if noisy_total is None:
        noisy_total = 100 * per_small
    peer.reset()
    peer.start_worker()
    try:
        peer.wait_ready()
        errors: list[BaseException] = []

        def small_producer() -> None:
            start = time.time()
            try:
                for at, tenant in schedule:
                    delay = start + at - time.time()
                    if delay > 0:
                        time.sleep(delay)
                    peer.enqueue(tenant, work_ms)
            except BaseException as err:
                errors.append(err)

        th = threading.Thread(target=small_producer)
        th.start()
        for i in range(0, noisy_total, noisy_batch):
            if noisy_batch == 1:
                peer.enqueue(NOISY, work_ms)
            else:
                peer.enqueue_batch(NOISY, min(noisy_batch, noisy_total - i), work_ms)
        burst_end = time.time()
        th.join()
        if errors:
            raise errors[0]
        total = noisy_total + len(schedule)
        wait_for_lines(peer.out, total + 1, timeout_s)
        recs = read_records(peer.out)
        small = [(r.start - r.enq) * 1000 for r in recs if r.tenant.startswith("t")]
        noisy = [(r.start - r.enq) * 1000 for r in recs if r.tenant == NOISY]
        # Small tenants' jobs enqueued after the burst was written: tells queueing behind
        # the noisy tenant's backlog apart from contention with the burst's writes.
        after = [
            (r.start - r.enq) * 1000 for r in recs if r.tenant.startswith("t") and r.enq > burst_end
        ]
        return {
            "small": latency_summary(small),
            "small_after_burst": latency_summary(after),
            "burst_s": burst_end - min((r.enq for r in recs if r.tenant == NOISY), default=0.0),
            "noisy": latency_summary(noisy),
            "expected": total,
            "ran": len(small) + len(noisy),
            "work_ms": work_ms,
            "window_s": window_s,
        }
    finally:
        peer.stop_worker()


def flat_noisy(r: dict[str, Any]) -> dict[str, float]:
    """:func:`noisy_neighbour`'s result as one flat record (ms, and the burst in s)."""
    return {
        "small_p50": r["small"]["p50"],
        "small_p99": r["small"]["p99"],
        "small_max": r["small"]["max"],
        "small_p99_after_burst": r["small_after_burst"]["p99"],
        "noisy_p50": r["noisy"]["p50"],
        "noisy_p99": r["noisy"]["p99"],
        "burst_s": r["burst_s"],
    }


def delayed(
    peer: Peer, n: int, lo_s: float, hi_s: float, seed: int = 11, timeout_s: float = 60.0
) -> dict[str, Any]:
    rng = random.Random(seed)
    peer.reset()
    peer.start_worker()
    try:
        peer.wait_ready()
        for i in range(n):
            peer.enqueue_delayed(f"t{i % SMALL_TENANTS}", rng.uniform(lo_s, hi_s))
        wait_for_lines(peer.out, n + 1, hi_s + timeout_s)
        recs = [r for r in read_records(peer.out) if r.tenant != "warmup"]
        late = [(r.start - r.due) * 1000 for r in recs]
        return {**latency_summary(late), "expected": n, "early": sum(x < 0 for x in late)}
    finally:
        peer.stop_worker()
