"""Running quick for the benchmarks: the job, consumer configurations, a consumer process.

``python -m bench.quickrun URL --config JSON --expect N --done FILE --seconds S`` runs one
consumer in its own process (sqlite:// shares the file with the bench process); it writes
the wall time at which its ``completed`` counter reached N (or its stats at the end) to
FILE as JSON, so completion (not just start) is what the end-to-end rate counts.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from bench.common import record_start
from quickzones.client import Quick
from quickzones.consumer import Consumer, ConsumerConfig

JOB = "bench"
NOOP = "noop"
SLEEP = "sleep"  # payload {"w": ms}: sleeps that long, records nothing (bench.scaling)


def open_quick(url: str, *, fifo: bool = False) -> Quick:
    q = Quick.open(url, fifo=fifo)

    @q.job(JOB)
    def bench_job(payload: Any, ctx: Any) -> None:
        # "i": record the item's id too (bench.visits_contention counts ids).
        item_id = ctx.item_id if payload.get("i") else ""
        record_start(payload["t"], payload["e"], payload["d"], payload.get("w", 0.0), item_id)

    @q.job(NOOP)
    def noop(payload: Any, ctx: Any) -> None:
        return None

    @q.job(SLEEP)
    def sleep(payload: Any, ctx: Any) -> None:
        time.sleep(payload["w"] / 1000)

    return q


def user_worker_cmd(workers: int) -> list[str]:
    """``quick worker`` as the README starts it, ``--workers`` its only option, running the
    handlers of :mod:`bench.user_app` on the store ``QUICK_STORE`` names."""
    return [
        sys.executable,
        "-m",
        "quickzones",
        "worker",
        "--app-module",
        "bench.user_app:q",
        "--workers",
        str(workers),
    ]


def throughput_config(**over: Any) -> ConsumerConfig:
    """No-op items: big batches per zone visit and few threads (the GIL is the limit, so
    more threads only add switching)."""
    base: dict[str, Any] = dict(
        peek_max=100,
        selection_frac=1.0,
        selection_max=16,
        processing_bound=2000,
        dequeue_max=100,
        managers=4,
        workers=4,
        idle_sleep_s=0.005,
        in_order=False,
        pipelined_scans=False,  # bigger batches per visit: throughput over latency
    )
    base.update(over)
    return ConsumerConfig(**base)


def latency_config(**over: Any) -> ConsumerConfig:
    """Items with a few ms of work and latency-sensitive workloads: small per-zone batches
    (water-filling fairness), a short idle sleep so newly vested pointers are seen soon."""
    base: dict[str, Any] = dict(
        peek_max=200,
        selection_frac=1.0,
        selection_max=32,
        processing_bound=32,
        dequeue_max=2,
        managers=8,
        workers=16,
        idle_sleep_s=0.005,
        pointer_lease_s=1.0,
        min_inactive_s=2.0,
    )
    base.update(over)
    return ConsumerConfig(**base)


def config_to_json(cfg: ConsumerConfig) -> str:
    return json.dumps(asdict(cfg))


def wait_completed(consumer: Consumer, n: int, timeout_s: float) -> float:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if consumer.stats["completed"] >= n:
            return time.time()
        time.sleep(0.002)
    return float("nan")


def count_one_transaction_visits() -> dict[str, int]:
    """Count the one-transaction visits this process tries, commits and loses to a conflict
    (wraps the top-level queues' ``run_visit`` here, in the bench; the library is
    unchanged): how many visits the gate let try one transaction, and how many of those
    committed."""
    from quickzones.store.kv import UNCOMMITTED
    from quickzones.store.toplevel import TopLevelQueue

    counts = {"tried": 0, "committed": 0, "conflicted": 0}
    original = TopLevelQueue.run_visit

    def counted(top: Any, fn: Any) -> Any:
        counts["tried"] += 1
        result = original(top, fn)
        counts["conflicted" if result is UNCOMMITTED else "committed"] += 1
        return result

    TopLevelQueue.run_visit = counted  # type: ignore[method-assign]
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--config", default="{}")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--done", default="")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--ready", default="")
    args = ap.parse_args()
    q = open_quick(args.url)
    events: dict[str, list[float]] = {"lag_ms": [], "pickup_ms": []}
    reasons: dict[str, int] = {}

    def observer(event: str, fields: dict[str, Any]) -> None:
        # Cheap: only the paper's fairness and contention measurements.
        if event == "pointer_leased":
            events["lag_ms"].append(fields["lag_ms"])
        elif event == "dequeued":
            events["pickup_ms"].append(fields["pickup_ms"] - fields["enqueued_ms"])
        elif event == "pointer_lease_failed":
            reasons[fields["reason"]] = reasons.get(fields["reason"], 0) + 1

    # SIGTERM ends a timed run early but still writes the stats.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    one_tx = count_one_transaction_visits()
    consumer = q.consumer(ConsumerConfig(**json.loads(args.config)), observer=observer)
    consumer.start()
    t0 = time.time()
    cpu_ready = time.process_time()
    if args.ready:
        with open(args.ready, "w") as f:
            f.write(str(t0))
    done_at = float("nan")
    cpu_at_done = float("nan")
    if args.expect:
        done_at = wait_completed(consumer, args.expect, args.seconds)
        cpu_at_done = time.process_time()  # this process's CPU (all threads) until done
    else:
        stop.wait(args.seconds)
    consumer.stop(deadline_s=5.0)
    if args.done:
        with open(args.done, "w") as f:
            json.dump(
                {
                    "done_at": done_at,
                    "started_at": t0,
                    "cpu_s": cpu_at_done,
                    "cpu_ready_s": cpu_ready,
                    "stats": dict(consumer.stats),
                    "lease_failed": reasons,
                    "one_transaction_visits": one_tx,
                    **events,
                },
                f,
            )
    q.close()


if __name__ == "__main__":
    main()
