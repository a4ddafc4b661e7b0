"""quick serve, measured: the pull API beside the in-process consumer on one sqlite store.

1. Fairness and pickup: a noisy tenant's backlog plus fifty small tenants that each get
   an item every ``--period`` seconds; small-tenant pickup latency (handler start minus
   enqueue) p50/p99, with 4 remote pull consumers (separate processes, ``RemoteWorker``
   through ``quick serve`` in its own process) and with one in-process consumer.
2. Throughput: items/s draining a preloaded backlog, same two set-ups.
3. Enqueue latency at a fixed request rate: over HTTP and in-process.

    python -m bench.serve_pull [--seconds 10] [--out FILE]

It prints its JSON; ``--out`` also writes it, e.g. to an untracked
``bench/results/<UTC timestamp>-serve/serve_pull.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.tokens import TokenStore
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.cli.demo import percentile
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.testing.provision.ports import free_port

SMALL = 50


def _stats(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    return {"n": len(s), "p50": percentile(s, 50), "p99": percentile(s, 99), "max": s[-1]}


def _remote_consumer(url: str, token: str, seconds: float, out: Any, ready: Any) -> None:
    """One pull consumer process: runs a no-op handler, reports pickups by tenant."""
    ready.wait()  # start together, once every process has imported and connected
    handlers = Quick.open("memory://")
    seen: list[tuple[str, float]] = []

    @handlers.job("work")
    def work(payload: Any, ctx: Any) -> None:
        seen.append((ctx.tenant, time.time() * 1000 - ctx.item.enqueued_ms))

    with RemoteQuick(url, token) as client:
        worker = RemoteWorker(handlers.registry, client, workers=8, lease_s=30, wait_s=1)
        threading.Timer(seconds, worker.request_stop).start()
        out.put("started")
        worker.run_forever()
        worker.close()
    out.put(seen)


def _serve(store: str, visits: str = "three") -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quickzones",
            "serve",
            "--store",
            store,
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-dashboard",
            f"--{visits}-transaction-visits",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("quick serve did not start")


def _trickle(q: Quick, seconds: float, period: float, stop: threading.Event) -> int:
    """Each small tenant gets one item every ``period`` seconds (staggered)."""
    sent = 0
    start = time.monotonic()
    n = 0
    while not stop.is_set() and time.monotonic() - start < seconds:
        tenant = f"small-{n % SMALL:02d}"
        q.enqueue("work", n, app="bench", tenant=tenant)
        sent += 1
        n += 1
        time.sleep(period / SMALL)
    return sent


def _noisy(q: Quick, n: int) -> None:
    for start in range(0, n, 500):
        q.enqueue_many("work", list(range(min(500, n - start))), app="bench", tenant="noisy")


def _drained(q: Quick) -> bool:
    from quickzones.adapters.http.views import app_figures

    return app_figures(q, "bench").items == 0


def _start_remote(url: str, token: str, seconds: float, consumers: int) -> tuple[list[Any], Any]:
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    ready: Any = ctx.Event()
    procs = [
        ctx.Process(target=_remote_consumer, args=(url, token, seconds, out, ready))
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    time.sleep(3)  # spawned interpreters import quickzones
    ready.set()
    for _ in procs:
        assert out.get(timeout=60) == "started"
    return procs, out


def _collect(procs: list[Any], out: Any, timeout: float) -> list[tuple[str, float]]:
    seen: list[tuple[str, float]] = []
    for _ in procs:
        seen.extend(out.get(timeout=timeout))
    for p in procs:
        p.join(timeout=30)
    return seen


def run_remote(store: str, token: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    q = Quick.open(store)
    try:
        _noisy(q, args.noisy)
        procs, out = _start_remote(url, token, args.seconds + 3, args.consumers)
        stop = threading.Event()
        started = time.monotonic()
        sent = _trickle(q, args.seconds, args.period, stop)
        seen = _collect(procs, out, args.seconds + 60)
        elapsed = time.monotonic() - started
        return _pickup_result(seen, elapsed, sent, args.noisy)
    finally:
        q.close()


def _pickup_result(
    seen: list[tuple[str, float]], elapsed: float, sent: int, noisy: int
) -> dict[str, Any]:
    small = [ms for tenant, ms in seen if tenant.startswith("small")]
    return {
        "items_run": len(seen),
        "items_per_s": round(len(seen) / elapsed, 1),
        "small_sent": sent,
        "small_pickup_ms": _stats(small),
        "noisy_left": noisy + sent - len(seen),
    }


def run_local(store: str, args: argparse.Namespace) -> dict[str, Any]:
    q = Quick.open(store)
    seen: list[tuple[str, float]] = []

    @q.job("work")
    def work(payload: Any, ctx: Any) -> None:
        seen.append((ctx.tenant, time.time() * 1000 - ctx.item.enqueued_ms))

    try:
        _noisy(q, args.noisy)
        consumer = q.consumer(
            ConsumerConfig(
                workers=8 * args.consumers,
                managers=4,
                one_transaction_visits=args.visits == "one",
            )
        )
        consumer.start()
        started = time.monotonic()
        stop = threading.Event()
        sent = _trickle(q, args.seconds, args.period, stop)
        time.sleep(3)
        consumer.stop()
        elapsed = time.monotonic() - started
        return _pickup_result(seen, elapsed, sent, args.noisy)
    finally:
        q.close()


def _backlog(q: Quick, n: int) -> None:
    for t in range(20):
        q.enqueue_many("work", list(range(n // 20)), app="bench", tenant=f"bulk-{t:02d}")


def drain_remote(store: str, token: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Items/s draining a preloaded backlog of 20 zones with the remote consumers."""
    q = Quick.open(store)
    try:
        _backlog(q, args.backlog)
        procs, _out = _start_remote(url, token, 600, args.consumers)
        started = time.monotonic()
        while not _drained(q):
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        for p in procs:
            os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            p.join(timeout=30)
        return {"items": args.backlog, "seconds": round(elapsed, 2),
                "items_per_s": round(args.backlog / elapsed, 1)}  # fmt: skip
    finally:
        q.close()


def drain_local(store: str, args: argparse.Namespace) -> dict[str, Any]:
    q = Quick.open(store)

    @q.job("work")
    def work(payload: Any, ctx: Any) -> None:
        pass

    try:
        _backlog(q, args.backlog)
        consumer = q.consumer(
            ConsumerConfig(
                workers=8 * args.consumers,
                managers=4,
                one_transaction_visits=args.visits == "one",
            )
        )
        started = time.monotonic()
        consumer.start()
        while not _drained(q):
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        consumer.stop()
        return {"items": args.backlog, "seconds": round(elapsed, 2),
                "items_per_s": round(args.backlog / elapsed, 1)}  # fmt: skip
    finally:
        q.close()


def enqueue_latency(
    store: str, token: str, url: str, rate: float, seconds: float
) -> dict[str, Any]:
    q = Quick.open(store)
    out: dict[str, Any] = {"rate_per_s": rate}
    try:
        with RemoteQuick(url, token) as rq:
            for name, call in (
                ("http", lambda n: rq.enqueue("lat", n, app="lat", tenant=f"t{n % 100}")),
                ("in_process", lambda n: q.enqueue("lat", n, app="lat", tenant=f"t{n % 100}")),
            ):
                lat: list[float] = []
                start = time.monotonic()
                n = 0
                while time.monotonic() - start < seconds:
                    due = start + n / rate
                    pause = due - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
                    t0 = time.perf_counter()
                    call(n)
                    lat.append((time.perf_counter() - t0) * 1000)
                    n += 1
                out[name] = _stats(lat)
    finally:
        q.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--period", type=float, default=1.0, help="each small tenant, one item per")
    ap.add_argument("--noisy", type=int, default=3000)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--backlog", type=int, default=4000)
    ap.add_argument(
        "--visits",
        choices=("three", "one"),
        default="three",
        help="zone visits of the server and the in-process consumer: the paper's three "
        "transactions or one",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results: dict[str, Any] = {
        "setup": {k: v for k, v in vars(args).items() if k != "out"},
        "cpus": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{Path(tmp) / 'bench.db'}"
        q = Quick.open(store)
        token = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["produce", "consume"])[0]
        q.close()
        server, url = _serve(store, args.visits)
        try:
            results["remote"] = run_remote(store, token, url, args)
            results["in_process"] = run_local(store, args)
            results["drain_remote"] = drain_remote(store, token, url, args)
            results["drain_in_process"] = drain_local(store, args)
            results["enqueue_latency_ms"] = enqueue_latency(store, token, url, args.rate, 5.0)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)
    remote = results["remote"]["small_pickup_ms"].get("p99")
    local = results["in_process"]["small_pickup_ms"].get("p99")
    if remote is not None and local:
        results["small_p99_remote_over_in_process"] = round(remote / local, 2)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
