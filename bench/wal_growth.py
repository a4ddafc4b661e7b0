"""How large the SQLite WAL grows under continuous load (issue 12 point 9).

``python -m bench.wal_growth [--load readers|consumer|both] [--seconds 15]``

* ``readers``: one writer committing 20 x 1 KB values per transaction as fast as it can,
  and four reader threads whose read transactions (a range read, then 50 ms holding the
  snapshot) overlap, so some snapshot is always open;
* ``consumer``: a producer enqueueing continuously and a consumer whose transactional
  handler holds its transaction for 0.2 s.

Prints the largest ``-wal`` size seen (sampled every 50 ms) and the commit count.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from quickzones.backends.sqlite import SQLiteStore
from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.store.kv import KVTransaction, run


def _watch(path: str, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], os.path.getsize(path + "-wal"))
        except OSError:
            pass
        time.sleep(0.05)


def _timed(path: str, seconds: float, start: Callable[[threading.Event], list[Any]]) -> int:
    """Run the load ``start`` sets going for ``seconds``; the peak WAL size in bytes."""
    stop = threading.Event()
    peak = [0]
    watcher = threading.Thread(target=_watch, args=(path, stop, peak), daemon=True)
    watcher.start()
    threads = start(stop)
    time.sleep(seconds)
    stop.set()
    for thread in [*threads, watcher]:
        thread.join(timeout=30)
    return peak[0]


def overlapping_readers(path: str, seconds: float) -> tuple[int, int]:
    """(peak WAL bytes, commits) with one writer and four overlapping readers."""
    store = SQLiteStore(path)
    commits = [0]
    value = os.urandom(1000)

    def writer(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():

            def write(tr: KVTransaction, n: int = n) -> None:
                for j in range(20):
                    tr.set(b"k%03d-%02d" % (n % 500, j), value)

            run(store, write)
            commits[0] += 1
            n += 1

    def reader(stop: threading.Event, offset: float) -> None:
        time.sleep(offset)
        while not stop.is_set():

            def read(tr: KVTransaction) -> None:
                tr.get_range(b"k", b"l", limit=50)
                time.sleep(0.05)  # holds the snapshot, as a slow handler would

            run(store, read)

    def start(stop: threading.Event) -> list[Any]:
        threads = [threading.Thread(target=writer, args=(stop,))]
        threads += [threading.Thread(target=reader, args=(stop, i * 0.0125)) for i in range(4)]
        for thread in threads:
            thread.start()
        return threads

    peak = _timed(path, seconds, start)
    store.close()
    return peak, commits[0]


def slow_consumer(path: str, seconds: float) -> tuple[int, int]:
    """(peak WAL bytes, items done) with a consumer of 0.2 s transactional handlers."""
    q = Quick.open(f"sqlite:///{path}")
    done = [0]

    @q.job("slow", transactional=True)
    def slow(payload: Any, ctx: Any) -> None:
        ctx.tr.get(b"effects/" + ctx.tenant.encode())  # reads first: holds a snapshot
        time.sleep(0.2)
        ctx.tr.set(b"effects/" + ctx.item_id.encode(), b"x" * 500)
        done[0] += 1

    def producer(stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            q.enqueue_many("slow", [b"p" * 1000] * 20, app="a", tenant=f"t{n % 50}")
            n += 1
            time.sleep(0.005)

    consumer = q.consumer(ConsumerConfig(workers=32, managers=4))

    def start(stop: threading.Event) -> list[Any]:
        consumer.start()
        thread = threading.Thread(target=producer, args=(stop,))
        thread.start()
        return [thread]

    peak = _timed(path, seconds, start)
    consumer.stop(deadline_s=2.0)
    q.close()
    return peak, done[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=("readers", "consumer", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    loads = ("readers", "consumer") if args.load == "both" else (args.load,)
    for load in loads:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "wal.db")
            fn = overlapping_readers if load == "readers" else slow_consumer
            peak, count = fn(path, args.seconds)
            unit = "commits" if load == "readers" else "items"
            print(
                f"{load}: peak WAL {peak / 1e6:.1f} MB over {args.seconds:g} s ({count} {unit})",
                flush=True,
            )


if __name__ == "__main__":
    main()
