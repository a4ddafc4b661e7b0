"""End-to-end throughput over Cassandra items: enqueue N no-op items over Z zones, run one
consumer (threads) until all are done, report items/s; median of R runs.

    python -m integration.cassandra_adapter.bench_e2e                     # starts a node
    CASSANDRA_CONTACT_POINTS=127.0.0.1:9042 python -m integration.cassandra_adapter.bench_e2e

Pointers live in a SQLite file. Enqueue time is reported separately from drain time; the
items/s figure is the drain (dequeue, run, complete), which is what consumers sustain.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from integration.cassandra_local import LocalCassandra
from quickzones.adapters.cassandra import init_schema, open_cassandra_quick
from quickzones.consumer import ConsumerConfig


def one_run(node: LocalCassandra, items: int, zones: int, workers: int) -> tuple[float, float]:
    keyspace = f"bench_{uuid.uuid4().hex[:8]}"
    cluster = node.cluster()
    session = cluster.connect()
    session.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    init_schema(session, keyspace, replication=None)
    url = f"cassandra://{node.contact_points[0]}:{node.port}/{keyspace}"
    with tempfile.TemporaryDirectory() as tmp:
        q = open_cassandra_quick(url, f"sqlite:///{Path(tmp) / 'p.db'}")
        done = [0]
        lock = threading.Lock()
        finished = threading.Event()

        @q.job("noop")
        def noop(payload: object, ctx: object) -> None:
            with lock:
                done[0] += 1
                if done[0] >= items:
                    finished.set()

        started = time.monotonic()
        for n in range(items):
            q.enqueue("noop", b"", app="bench", tenant=f"t{n % zones}")
        enqueue_rate = items / (time.monotonic() - started)
        consumer = q.consumer(
            ConsumerConfig(
                workers=workers, managers=4, dequeue_max=20, idle_sleep_s=0.005, in_order=False
            )
        )
        started = time.monotonic()
        consumer.start()
        finished.wait(600)
        drain_rate = items / (time.monotonic() - started)
        consumer.stop()
        q.close()
    session.execute(f"DROP KEYSPACE {keyspace}")
    cluster.shutdown()
    return enqueue_rate, drain_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--zones", type=int, default=50)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    node = LocalCassandra()
    node.start()
    node.wait_ready()
    if node.last_ready_seconds is not None:
        print(f"Cassandra ready in {node.last_ready_seconds:.1f}s ({node.mode})")
    try:
        enq, drain = [], []
        for r in range(args.runs):
            e, d = one_run(node, args.items, args.zones, args.workers)
            enq.append(e)
            drain.append(d)
            print(f"run {r + 1}: enqueue {e:.0f} items/s, end-to-end drain {d:.0f} items/s")
        print(
            f"median of {args.runs}: enqueue {statistics.median(enq):.0f} items/s, "
            f"end-to-end {statistics.median(drain):.0f} items/s "
            f"({args.items} no-op items over {args.zones} zones, {args.workers} workers)"
        )
    finally:
        node.close()


if __name__ == "__main__":
    main()
