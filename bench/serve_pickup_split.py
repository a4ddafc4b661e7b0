"""Where a small tenant's pickup time goes with remote pull consumers (bench.serve_pull's
fairness phase only): enqueue -> dequeue (waiting for a lease's scan to choose the zone,
and the dequeue transaction) and dequeue -> handler start, itself split at the moment the
worker's lease call returns (the rest of that call and the response; then the worker's
dispatch), with each process's CPU share while it runs.

The dequeue time is the lease's expiry minus the lease length (the time the dequeue
transaction read its clock). Run it under the bench lock:

    flock /work/bench.lock python -m bench.serve_pickup_split [--noisy 3000] [--seconds 10]
        [--fill-s 0.005] [--complete-linger-s 0.01]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import serve_pull as sp
from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.tokens import TokenStore
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick

LEASE_S = 30


def _consumer(
    url: str, token: str, seconds: float, out: Any, ready: Any, options: dict[str, float]
) -> None:
    ready.wait()
    handlers = Quick.open("memory://")
    seen: list[tuple[str, int, int, float, float]] = []
    received: dict[str, float] = {}  # item id: when its lease call returned

    @handlers.job("work")
    def work(payload: Any, ctx: Any) -> None:
        now = time.time() * 1000
        dequeued = ctx.item.vesting_ms - LEASE_S * 1000
        got = received.pop(ctx.item.item_id, now)
        seen.append((ctx.tenant, ctx.item.enqueued_ms, dequeued, got, now))

    with RemoteQuick(url, token) as client:
        leasing = client.lease

        def lease(*args: Any, **kwargs: Any) -> Any:
            out = leasing(*args, **kwargs)
            now = time.time() * 1000
            for x in out:
                received[x.item_id] = now
            return out

        client.lease = lease  # type: ignore[method-assign]
        worker = RemoteWorker(
            handlers.registry, client, workers=8, lease_s=LEASE_S, wait_s=1, **options
        )
        threading.Timer(seconds, worker.request_stop).start()
        out.put("started")
        worker.run_forever()
        worker.close()
    out.put(seen)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stats(values: list[float]) -> str:
    s = sorted(values)
    if not s:
        return "n 0"
    at = lambda q: s[min(len(s) - 1, int(len(s) * q))]  # noqa: E731
    return f"p50 {at(0.5):.1f} p90 {at(0.9):.1f} p99 {at(0.99):.1f} n {len(s)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--noisy", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--fill-s", type=float, default=None, help="RemoteWorker(fill_s=...)")
    ap.add_argument(
        "--complete-linger-s", type=float, default=None, help="RemoteWorker(complete_linger_s=)"
    )
    args = ap.parse_args()
    options = {
        name: value
        for name, value in (("fill_s", args.fill_s), ("complete_linger_s", args.complete_linger_s))
        if value is not None
    }
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{Path(tmp) / 'bench.db'}"
        q = Quick.open(store)
        token = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["produce", "consume"])[0]
        server, url = sp._serve(store)
        try:
            sp._noisy(q, args.noisy)
            ctx = mp.get_context("spawn")
            out: Any = ctx.Queue()
            ready: Any = ctx.Event()
            procs = [
                ctx.Process(
                    target=_consumer, args=(url, token, args.seconds + 3, out, ready, options)
                )
                for _ in range(args.consumers)
            ]
            for p in procs:
                p.start()
            time.sleep(3)
            ready.set()
            for _ in procs:
                assert out.get(timeout=60) == "started"
            pids = {"server": server.pid, "bench": os.getpid()}
            pids.update({f"consumer{i}": p.pid for i, p in enumerate(procs)})
            before = {k: _cpu_s(pid) for k, pid in pids.items()}
            t0 = time.time() * 1000
            sp._trickle(q, args.seconds, 1.0, threading.Event())
            elapsed = time.time() - t0 / 1000
            after = {k: _cpu_s(pid) for k, pid in pids.items()}
            seen: list[tuple[str, int, int, float, float]] = []
            for _ in procs:
                seen.extend(out.get(timeout=args.seconds + 60))
            for p in procs:
                p.join(30)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(30)
            q.close()
    share = {k: round((after[k] - before[k]) / elapsed, 2) for k in pids}
    print("CPU (cores) while small tenants enqueue:", share)
    small = [s for s in seen if s[0].startswith("small")]
    noisy_done = max((s[4] for s in seen if not s[0].startswith("small")), default=t0) - t0
    print(f"noisy backlog drained {noisy_done:.0f} ms after the small tenants began")
    print("pickup           ", _stats([s[4] - s[1] for s in small]))
    print("enqueue->dequeue ", _stats([s[2] - s[1] for s in small]))
    print("dequeue->handler ", _stats([s[4] - s[2] for s in small]))
    print("  dequeue->lease call returned", _stats([s[3] - s[2] for s in small]))
    print("  returned->handler           ", _stats([s[4] - s[3] for s in small]))
    idle = [s for s in small if s[1] - t0 >= noisy_done]
    if idle:
        print("pickup, backlog drained", _stats([s[4] - s[1] for s in idle]))


if __name__ == "__main__":
    main()
