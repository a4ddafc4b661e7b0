"""quick itself behind the peer interface, so it runs the very same workloads.

memory:// lives in the bench process, so its consumer runs there too (producer and
consumer share one interpreter and its GIL); sqlite:// runs the consumer as its own
process (``python -m bench.quickrun``) like the peers' workers.
"""

from __future__ import annotations

import compileall
import dataclasses
import functools
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.base import Peer
from bench.quickrun import JOB, config_to_json, open_quick, user_worker_cmd
from quickzones.consumer import ConsumerConfig

# Given the store URL and the consumer's config as JSON, the command of a consumer process.
ConsumerCommand = Callable[[str, str], list[str]]


@functools.cache
def compile_bytecode() -> None:
    """Byte-compile quickzones and the benchmarks' handler modules once, as pip does when
    it installs a package (the peers' packages are installed so). An editable install run
    where ``PYTHONDONTWRITEBYTECODE`` is set (this machine's environment) keeps no
    bytecode, so every worker process spawned compiled quickzones' ~200 modules from
    source before its first pickup: about 0.5 s of CPU in each drain's start-up that no
    installed copy pays (issue 44 point 2)."""
    import quickzones
    import quickzones.adapters
    import quickzones.backends

    folders = [*quickzones.__path__, *quickzones.backends.__path__, *quickzones.adapters.__path__]
    folders.append(str(Path(__file__).resolve().parents[1]))  # bench/: the handlers' modules
    for folder in dict.fromkeys(folders):
        compileall.compile_dir(folder, quiet=2)  # one that cannot be written is left as is


def user_consumer(workers: int) -> ConsumerCommand:
    """``quick worker --workers N`` as a user runs it (:func:`bench.quickrun.user_worker_cmd`,
    every other setting at its default) on the peer's store: no profile."""

    def command(url: str, _config: str) -> list[str]:
        return ["env", f"QUICK_STORE={url}", *user_worker_cmd(workers)]

    return command


def peer_config(throughput: bool = False) -> ConsumerConfig:
    """8 workers like the peers' 8 threads and a 5 ms idle poll, in one of two profiles.

    Fairness (workloads ii and iii): a small processing bound and per-visit batch, so a
    backlogged zone cannot fill the local queue ahead of other tenants (water-filling),
    and each zone visit committed once (``one_transaction_visits``, the setting for one
    consumer process per SQLite file): in the noisy-neighbour workload every small
    tenant's item takes a visit of its own, the visits are what the consumer is short of
    while the burst drains (its managers ~85% busy, each commit waiting ~2-3 ms for the
    store's write lock); one commit per visit instead of three about halved the small
    tenants' median pickup and lowered their p99 by a fifth or more, still far above
    20 ms, and the burst drained sooner (bench/results/README.md#20261124t041424z-noisy).
    Up to 16 zones per visit transaction (``visits_per_transaction``) on one manager
    thread: while the burst drains, the small tenants' pointers vest a few at a time and
    one commit visits them all; one manager's batches beat four managers' smaller
    concurrent ones, which only contend for the GIL and the store's write lock (small
    tenants' p99 37.6 against 54.8 ms, against 61.0 ms one zone per transaction, 7
    interleaved rounds, bench/results/README.md#20261124t075000z-batched-visits).
    A scan passes over a zone holding 8 of the consumer's items (``skip_held_zones_at``,
    the number of workers): the noisy tenant's zone is not visited again while its items
    fill the workers, and the visits go to the small tenants (small tenants' p99 45.1 ->
    26.4 ms, better in 8 of 8 interleaved pairs; the noisy tenant's p50 634 -> 885 ms;
    ``dequeue_max`` 16 with it was worse, 28.1 -> 33.6 ms, and a mark of 4 no better,
    bench/results/README.md#20261124t175500z-visit-cpu).
    Completions flushed every 10 ms (``completion_flush_s``) rather than as soon as any
    finished: a tenth of the commits competing with the visits (small tenants' p99 32.0
    -> 25.8 ms, better in 6 of 6 interleaved pairs, the consumer's CPU -6%; 20 ms was no
    better than 10, 26.2 against 26.0 ms).
    Commit-counter wake-ups every 1 ms (``commit_poll_s``): an idle scanner rescans
    within a millisecond of the producer's enqueue instead of at its next 5 ms poll.
    Since the counter ignores the consumer's own commits (it once rescanned after each
    completion, and at 2 ms made small tenants' p99 worse, 13.4 -> 18.1 ms), 10
    interleaved pairs: small tenants' p50 6.9 -> 4.65 ms (better in 10 of 10), p99 21.2
    -> 20.5 ms (5 of 10: not shown), the consumer's CPU +18%; small tenants alone, 6
    pairs: p50 6.35 -> 4.65 ms, p99 19.9 -> 16.6 ms (3 of 6)
    (bench/results/README.md#20261124t212000z-pickup).
    Throughput (workload i, where the peers run their documented throughput setups too):
    large per-visit batches and a deep local queue, as in the core benchmark.
    """
    return ConsumerConfig(
        peek_max=200,
        selection_frac=1.0,
        selection_max=32,
        processing_bound=400 if throughput else 24,
        dequeue_max=100 if throughput else 8,
        managers=4 if throughput else 1,
        workers=8,
        idle_sleep_s=0.005,
        min_inactive_s=2.0,
        one_transaction_visits=not throughput,
        visits_per_transaction=1 if throughput else 16,
        commit_poll_s=0.001,
        skip_held_zones_at=None if throughput else 8,
        completion_flush_s=0.0 if throughput else 0.01,
    )


class QuickPeer(Peer):
    batch_api = "Quick.enqueue_many (one transaction per zone)"

    def __init__(
        self,
        workdir: Path,
        backend: str,
        *,
        overrides: dict[str, Any] | None = None,
        consumer: ConsumerCommand | None = None,
        store: str | None = None,
        zones: str = "kv",
    ) -> None:
        """``overrides``: ConsumerConfig fields changed in both profiles; ``consumer``: the
        command of another consumer process than ``bench.quickrun`` (the results folders'
        probes, which instrument or switch parts of it); ``store``: a store URL every
        generation runs on instead of a fresh file each (bench.tenant_scale: a store that
        holds other apps' tenants); ``zones``: ``sql`` opens each SQLite file with
        ``zones=sql`` (items and pointers in tables of their own)."""
        super().__init__(workdir)
        self.zones = zones
        compile_bytecode()  # the worker processes' start-up, as an installed copy's
        self.backend = backend
        self.name = f"quick-{backend}"
        self.overrides = dict(overrides or {})
        self.consumer_command = consumer
        self.store = store
        cfg, fast = self.profile(), self.profile(throughput=True)
        self.config = (
            f"{'in-process consumer' if backend == 'memory' else 'one consumer process'}: "
            f"workers={cfg.workers} selection_frac="
            f"{cfg.selection_frac} idle_sleep_s={cfg.idle_sleep_s}; workload (i) "
            f"managers={fast.managers} dequeue_max={fast.dequeue_max} "
            f"processing_bound={fast.processing_bound}, "
            f"workloads (ii, iii) managers={cfg.managers} dequeue_max={cfg.dequeue_max} "
            f"processing_bound={cfg.processing_bound} "
            f"one_transaction_visits={cfg.one_transaction_visits} "
            f"visits_per_transaction={cfg.visits_per_transaction}"
        )
        if self.overrides:
            self.config += "; overrides " + " ".join(f"{k}={v}" for k, v in self.overrides.items())
        self.generation = 0
        self.q: Any = None
        self.consumer: Any = None
        self.reset()

    def profile(self, throughput: bool = False) -> ConsumerConfig:
        """:func:`peer_config` with this peer's overrides."""
        return dataclasses.replace(peer_config(throughput), **self.overrides)

    def _url(self) -> str:
        if self.store is not None:
            return self.store
        if self.backend == "memory":
            return "memory://"
        query = "" if self.zones == "kv" else f"?zones={self.zones}"
        return f"sqlite:///{self.workdir}/quick-{self.generation}.db{query}"

    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None:
        t = time.time()
        self.q.enqueue(JOB, {"t": tenant, "e": t, "d": t, "w": work_ms}, app="b", tenant=tenant)

    def enqueue_batch(self, tenant: str, n: int, work_ms: float = 0.0) -> None:
        t = time.time()
        self.q.enqueue_many(
            JOB, [{"t": tenant, "e": t, "d": t, "w": work_ms}] * n, app="b", tenant=tenant
        )

    def enqueue_delayed(self, tenant: str, delay_s: float) -> None:
        t = time.time()
        self.q.enqueue(
            JOB,
            {"t": tenant, "e": t, "d": t + delay_s, "w": 0.0},
            app="b",
            tenant=tenant,
            delay=delay_s,
        )

    def reset(self) -> None:
        if self.q is not None:
            self.q.close()
        self.generation += 1
        self.q = open_quick(self._url())

    def worker_cmd(self) -> list[str]:
        config = config_to_json(self.profile(self.throughput))
        if self.consumer_command is not None:
            return self.consumer_command(self._url(), config)
        return [
            sys.executable,
            "-m",
            "bench.quickrun",
            self._url(),
            "--config",
            config,
            "--seconds",
            "3600",
        ]

    def start_worker(self) -> None:
        if self.backend != "memory":
            super().start_worker()
            return
        self.out.write_bytes(b"")  # truncate, not unlink: an in-process O_APPEND fd stays valid
        self.consumer = self.q.consumer(self.profile(self.throughput))
        self.consumer.start()

    def stop_worker(self) -> None:
        if self.consumer is not None:
            self.consumer.stop(deadline_s=5)
            self.consumer = None
        super().stop_worker()

    def close(self) -> None:
        self.stop_worker()
        self.q.close()


def run_on_sqlite(workload: Callable[[QuickPeer], dict[str, Any]], **peer: Any) -> dict[str, Any]:
    """Run one peer workload (``bench.peer_workloads``) against quick on a fresh SQLite
    file; ``peer``: :class:`QuickPeer`'s keyword arguments."""
    with tempfile.TemporaryDirectory() as workdir:
        quick = QuickPeer(Path(workdir), "sqlite", **peer)
        try:
            return workload(quick)
        finally:
            quick.close()
