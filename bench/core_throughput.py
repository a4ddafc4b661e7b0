"""Core throughput targets: enqueue rates, drain rate, end-to-end rate (no-op handlers).

* enqueue (single): ``q.enqueue`` one item per transaction, tenants round robin;
* enqueue (many): ``q.enqueue_many`` in batches of 100 items per zone;
* drain: a pre-filled queue (``tenants`` zones) consumed by one consumer;
* end to end: a consumer running while a producer enqueues (enqueue_many, batches of 100);
  the rate is items / (last completion - first enqueue). On memory:// producer and consumer
  share the process (the store is in-process); on sqlite:// and fdb:// the consumer is its
  own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, fdb_url, log, summary
from bench.quickrun import NOOP, config_to_json, open_quick, throughput_config, wait_completed

# Each function returns (items/s, CPU µs per item). The machine may be shared (other
# processes on 2 cores), which wall-clock rates feel and CPU time per item mostly does
# not; 1e6 / cpu_us is the rate one fully available core would give a GIL-bound process.
Measured = tuple[float, float]

BATCH = 100


def _url(backend: str, tmp: str) -> str:
    if backend == "fdb":
        return fdb_url("core")
    return "memory://" if backend == "memory" else f"sqlite:///{tmp}/q.db"


def enqueue_single(backend: str, n: int, tenants: int) -> Measured:
    with tempfile.TemporaryDirectory() as tmp:
        q = open_quick(_url(backend, tmp))
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            q.enqueue(NOOP, b"", app="b", tenant=f"t{i % tenants}")
        rate = n / (time.perf_counter() - t0)
        cpu = (time.process_time() - c0) / n * 1e6
        q.close()
        return rate, cpu


def _fill(q: Any, n: int, tenants: int) -> None:
    i = 0
    while i < n:
        k = min(BATCH, n - i)
        q.enqueue_many(NOOP, [b""] * k, app="b", tenant=f"t{(i // BATCH) % tenants}")
        i += k


def enqueue_many(backend: str, n: int, tenants: int, *, fifo: bool = False) -> Measured:
    with tempfile.TemporaryDirectory() as tmp:
        q = open_quick(_url(backend, tmp), fifo=fifo)
        t0, c0 = time.perf_counter(), time.process_time()
        _fill(q, n, tenants)
        rate = n / (time.perf_counter() - t0)
        cpu = (time.process_time() - c0) / n * 1e6
        q.close()
        return rate, cpu


def consumer_command(url: str, n: int, done: str, ready: str, timeout_s: float) -> list[str]:
    """The one consumer process the core benchmark (and its profile harness) runs: the
    throughput profile, ``n`` items expected, ``done``/``ready`` files as its signals."""
    return [
        sys.executable,
        "-m",
        "bench.quickrun",
        url,
        "--config",
        config_to_json(throughput_config()),
        "--expect",
        str(n),
        "--done",
        done,
        "--seconds",
        str(timeout_s),
        "--ready",
        ready,
    ]


def _consumer_proc(
    url: str, n: int, tmp: str, timeout_s: float
) -> tuple[subprocess.Popen[bytes], str, str]:
    done, ready = os.path.join(tmp, "done.json"), os.path.join(tmp, "ready")
    proc = subprocess.Popen(consumer_command(url, n, done, ready, timeout_s), cwd=REPO)
    return proc, done, ready


def _wait_file(path: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)


def drain(backend: str, n: int, tenants: int, timeout_s: float = 120.0) -> Measured:
    with tempfile.TemporaryDirectory() as tmp:
        url = _url(backend, tmp)
        q = open_quick(url)
        _fill(q, n, tenants)
        if backend == "memory":
            c = q.consumer(throughput_config())
            t0, c0 = time.time(), time.process_time()
            c.start()
            t1 = wait_completed(c, n, timeout_s)
            cpu = (time.process_time() - c0) / n * 1e6
            c.stop(deadline_s=5)
            q.close()
            return n / (t1 - t0), cpu
        q.close()
        proc, done, _ = _consumer_proc(url, n, tmp, timeout_s)
        proc.wait(timeout_s + 30)
        res = json.loads(Path(done).read_text())
        # started_at is taken after the consumer process imported and opened the store;
        # its CPU until then (imports) is left out by subtracting the CPU at ready.
        cpu = (res["cpu_s"] - res["cpu_ready_s"]) / n * 1e6
        return float(n / (res["done_at"] - res["started_at"])), cpu


def end_to_end(
    backend: str, n: int, tenants: int, timeout_s: float = 120.0, *, fifo: bool = False
) -> Measured:
    with tempfile.TemporaryDirectory() as tmp:
        url = _url(backend, tmp)
        q = open_quick(url, fifo=fifo)
        if backend == "memory":
            c = q.consumer(throughput_config())
            c.start()
            t0, c0 = time.time(), time.process_time()
            producer = threading.Thread(target=_fill, args=(q, n, tenants))
            producer.start()
            t1 = wait_completed(c, n, timeout_s)
            cpu = (time.process_time() - c0) / n * 1e6
            producer.join()
            c.stop(deadline_s=5)
            q.close()
            return n / (t1 - t0), cpu
        proc, done, ready = _consumer_proc(url, n, tmp, timeout_s)
        _wait_file(ready, 30)
        t0, c0 = time.time(), time.process_time()
        _fill(q, n, tenants)
        producer_cpu = time.process_time() - c0
        proc.wait(timeout_s + 30)
        q.close()
        res = json.loads(Path(done).read_text())
        # Producer and consumer CPU together: the work one item costs the machine.
        cpu = (producer_cpu + res["cpu_s"] - res["cpu_ready_s"]) / n * 1e6
        return float(n / (res["done_at"] - t0)), cpu


def run(backends: list[str], runs: int, quick: bool) -> dict[str, Any]:
    n = 3000 if quick else 20000
    tenants = 100
    out: dict[str, Any] = {"n": n, "tenants": tenants, "batch": BATCH}
    for backend in backends:
        res: dict[str, Any] = {}
        for name, fn in (
            ("enqueue_single", enqueue_single),
            ("enqueue_many", enqueue_many),
            ("drain", drain),
            ("end_to_end", end_to_end),
        ):
            vals, cpus = [], []
            for r in range(runs):
                size = n // 4 if name == "enqueue_single" else n
                rate, cpu = fn(backend, size, tenants)
                vals.append(rate)
                cpus.append(cpu)
                log(
                    f"core {backend} {name} run {r + 1}/{runs}: {rate:.0f}/s, {cpu:.0f} µs CPU/item"
                )
            res[name] = summary(vals)
            res[name + "_cpu_us"] = summary(cpus)
        out[backend] = res
    out["fifo"] = fifo_cost(backends, runs, n, tenants)
    return out


def fifo_cost(backends: list[str], runs: int, n: int, tenants: int) -> dict[str, Any]:
    """FIFO (commit-versionstamp order) against plain enqueues, run alternately so both
    see the same machine; the ratio is taken per pair of runs, then its median."""
    out: dict[str, Any] = {}
    for backend in backends:
        res: dict[str, Any] = {}
        for name, fn in (("enqueue_many", enqueue_many), ("end_to_end", end_to_end)):
            plain, fifo, ratios = [], [], []
            for r in range(runs):
                p_rate, _ = fn(backend, n, tenants)
                f_rate, _ = fn(backend, n, tenants, fifo=True)
                plain.append(p_rate)
                fifo.append(f_rate)
                ratios.append(f_rate / p_rate)
                log(
                    f"fifo {backend} {name} run {r + 1}/{runs}: plain {p_rate:.0f}/s, "
                    f"fifo {f_rate:.0f}/s ({f_rate / p_rate:.2f})"
                )
            res[name] = {
                "plain": summary(plain),
                "fifo": summary(fifo),
                "ratio": summary(ratios),
            }
        out[backend] = res
    return out
