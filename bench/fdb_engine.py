"""FoundationDB-specific measurements (issue 14, point 5), beside sqlite:// where it helps:

* commit latency percentiles: a one-key write transaction, and one ``enqueue``;
* one tenant versus the same items spread over 50 tenants, drained by an in-process
  consumer with 4 workers (each visit of ``dequeue_max`` items costs several commits);
* where the time goes: a cProfile of that in-process drain on fdb://, top functions by
  internal time, written to ``fdb_profile.txt`` in the results folder.

The machine may be shared: compare the backends within one run (ratios), not across runs.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import fdb_url, latency_summary, log, summary
from bench.quickrun import NOOP, open_quick, throughput_config, wait_completed
from quickzones.store.kv import KVTransaction
from quickzones.store.kv import run as kv_run


def _url(backend: str, tmp: str, tag: str) -> str:
    return fdb_url(tag) if backend == "fdb" else f"sqlite:///{tmp}/{tag}.db"


def commit_latency(backend: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        q = open_quick(_url(backend, tmp, "lat"))
        one: list[float] = []
        enq: list[float] = []
        for i in range(n):
            key = b"lat/%d" % i

            def write(tr: KVTransaction, key: bytes = key) -> None:
                tr.set(key, b"x")

            t0 = time.perf_counter()
            kv_run(q.kv, write)
            one.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            q.enqueue(NOOP, b"", app="b", tenant=f"t{i % 10}")
            enq.append((time.perf_counter() - t0) * 1000)
        q.close()
    return {"one_key_ms": latency_summary(one), "enqueue_ms": latency_summary(enq)}


def drain_in_process(url: str, n: int, tenants: int) -> float:
    q = open_quick(url)
    i = 0
    while i < n:
        k = min(100, n - i)
        q.enqueue_many(NOOP, [b""] * k, app="b", tenant=f"t{(i // 100) % tenants}")
        i += k
    # The setting: 4 workers, visits of 10 items (the default dequeue_max).
    consumer = q.consumer(throughput_config(workers=4, dequeue_max=10))
    t0 = time.time()
    consumer.start()
    t1 = wait_completed(consumer, n, 300)
    consumer.stop(deadline_s=5)
    q.close()
    return n / (t1 - t0)


def _profile_threads(url: str, n: int, tenants: int) -> str:
    """cProfile in every consumer thread (threading.setprofile), merged."""
    import threading

    profiles: list[cProfile.Profile] = []

    def start_profile(*_: Any) -> None:
        threading.setprofile(None)
        p = cProfile.Profile()
        profiles.append(p)
        p.enable()

    threading.setprofile(start_profile)
    try:
        drain_in_process(url, n, tenants)
    finally:
        threading.setprofile(None)
    for p in profiles:
        p.disable()
    buf = io.StringIO()
    stats = pstats.Stats(profiles[0], stream=buf) if profiles else None
    if stats is None:
        return ""
    for p in profiles[1:]:
        stats.add(p)
    stats.sort_stats("tottime").print_stats(30)
    return buf.getvalue()


def run(runs: int, quick: bool, out: Path) -> dict[str, Any]:
    n_lat = 200 if quick else 1000
    n = 2000 if quick else 10000
    res: dict[str, Any] = {"n_latency": n_lat, "n_drain": n}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("sqlite", "fdb"):
            res[f"latency_{backend}"] = commit_latency(backend, n_lat)
            log(f"fdb section: {backend} commit latency {res[f'latency_{backend}']}")
        for backend in ("sqlite", "fdb"):
            for tenants in (1, 50):
                vals = []
                for r in range(runs):
                    rate = drain_in_process(_url(backend, tmp, f"d{tenants}-{r}"), n, tenants)
                    vals.append(rate)
                    log(f"fdb section: {backend} drain {tenants} tenants run {r + 1}: {rate:.0f}/s")
                res[f"drain_{backend}_{tenants}"] = summary(vals)
    text = _profile_threads(fdb_url("profile"), n, 50)
    (out / "fdb_profile.txt").write_text(text)
    return res
