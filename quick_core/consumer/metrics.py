"""Prometheus metrics from a consumer's events (``pip install 'quickzones[metrics]'``).

The consumer reports what it does as events to an observer; :class:`PrometheusObserver`
turns them into counters and histograms, and :func:`serve_metrics` exposes them over HTTP.
Under a supervisor (``quick worker --processes N``), :class:`SharedMetrics` serves every
child's metrics from one endpoint: each child counts into files of a folder
(prometheus_client's multiprocess mode) and the supervisor sums them at scrape time.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from quickzones.consumer.pickups import waited_ms
from quickzones.errors import ConfigurationError, MissingDependency
from quickzones.registry import Registry

if TYPE_CHECKING:
    from quickzones.client import Quick
    from quickzones.store.records import Pointer

# The job-type label of every type that was not declared: items of any name can be
# enqueued, and a label value per name would let producers grow the series without bound.
OTHER_JOB_TYPE = "(other)"

# Consumer events counted per job type, by the outcome they count as.
_OUTCOMES = {
    "completed": "completed",
    "requeued": "retried",
    "retried_inline": "retried",
    "dead_lettered": "dead_lettered",
    "nacked": "nacked",
}


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as err:
        raise MissingDependency("prometheus_client", "metrics") from err
    return prometheus_client


class PrometheusObserver:
    """Counts consumer events per app, and per job type what became of its runs and how
    long they took; lease failures by cause, pickup lag; whether this consumer is the
    in-order scanner, per cluster.

    ``job_types``: the declared types (a :class:`~quickzones.registry.Registry`, read at
    each event, or names); any other type is counted as :data:`OTHER_JOB_TYPE`."""

    def __init__(self, registry: Any = None, *, job_types: Registry | Iterable[str] = ()) -> None:
        prom = _prometheus()
        reg = registry if registry is not None else prom.REGISTRY
        self.declared = job_types if isinstance(job_types, Registry) else frozenset(job_types)
        self.jobs = prom.Counter(
            "quick_jobs_total",
            "What became of items, per job type: completed, failed (a run that raised), "
            "retried, nacked, dead_lettered",
            ["job_type", "outcome"],
            registry=reg,
        )
        self.run_seconds = prom.Histogram(
            "quick_job_run_seconds",
            "How long each run of a handler took, per job type",
            ["job_type"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
            registry=reg,
        )
        self.events = prom.Counter(
            "quick_events_total", "Consumer events by kind and app", ["event", "app"], registry=reg
        )
        self.lease_failures = prom.Counter(
            "quick_pointer_lease_failures_total",
            "Pointer leases that failed, by cause",
            ["reason"],
            registry=reg,
        )
        self.pickup = prom.Histogram(
            "quick_pickup_seconds",
            "Time from when an item vested (enqueued, its delay or retry backoff over) "
            "to its dequeue",
            ["app"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=reg,
        )
        self.unknown_job_types = prom.Counter(
            "quick_unknown_job_type",
            "Items left for another consumer: their job type is not handled by this one",
            ["job_type"],
            registry=reg,
        )
        self.scanner_lag = prom.Histogram(
            "quick_scanner_lag_seconds",
            "Time from a pointer vesting to its lease",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=reg,
        )

        self.in_order_scanner = prom.Gauge(
            "quick_in_order_scanner",
            "1 while this consumer is the in-order scanner of the cluster's top-level queue",
            ["cluster"],
            registry=reg,
            # Under a supervisor (SharedMetrics): 1 when any live process holds it.
            multiprocess_mode="livemax",
        )

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        if event == "scanner_election":  # every election refresh, per cluster
            held = 1 if fields.get("held") else 0
            self.in_order_scanner.labels(cluster=str(fields.get("cluster"))).set(held)
            return
        zone = fields.get("zone")
        app = zone.app if zone is not None else ""
        self.events.labels(event=event, app=app).inc()
        outcome = _OUTCOMES.get(event)
        if outcome is not None:
            self.jobs.labels(job_type=self._type(fields), outcome=outcome).inc()
        elif event == "ran":
            job_type = self._type(fields)
            self.run_seconds.labels(job_type=job_type).observe(max(0.0, fields["seconds"]))
            if not fields["ok"]:
                self.jobs.labels(job_type=job_type, outcome="failed").inc()
        if event == "pointer_lease_failed":
            self.lease_failures.labels(reason=str(fields.get("reason"))).inc()
        elif event == "dequeued":
            lag_ms = waited_ms(fields["enqueued_ms"], fields["pickup_ms"], fields.get("vested_ms"))
            self.pickup.labels(app=app).observe(lag_ms / 1000)
        elif event == "unknown_job_type":
            self.unknown_job_types.labels(job_type=str(fields.get("job_type"))).inc()
        elif event == "pointer_leased":
            self.scanner_lag.observe(max(0.0, fields.get("lag_ms", 0) / 1000))

    def _type(self, fields: dict[str, Any]) -> str:
        name = fields.get("job_type")
        if not isinstance(name, str):
            return OTHER_JOB_TYPE  # a corrupt item's type is unknown
        if isinstance(self.declared, Registry):
            return name if self.declared.find(name) is not None else OTHER_JOB_TYPE
        return name if name in self.declared else OTHER_JOB_TYPE


# What one reading of the store's gauges may cost: the pointers (and their zones' counts)
# it reads, across all shards. Past it the gauges are lower bounds and
# quick_store_gauges_complete says 0: a scrape costs the same at 10,000 active zones as at
# a million (issue 43), where it once read every one, a transaction per zone.
GAUGE_ZONES_MAX = 10_000
# How long a reading serves scrapes: Prometheus scrapes each worker every 15 s by default,
# and a scrape more often than this (several Prometheus servers, a curl loop) reads nothing.
GAUGE_REFRESH_S = 10.0
COUNT_CHUNK = 500  # zones whose counts one transaction reads


class StoreCollector:
    """Gauges read from the store at scrape time: queue depth and oldest vested age per
    app, pointers per shard, and whether that reading saw every active zone. One reading
    reads at most ``max_zones`` pointers and their zones' counts, and serves every scrape
    for ``refresh_s`` seconds (``now``: the clock that times it, passed in by tests).

    The oldest vested age of an app is how long its longest-waiting vested pointer has
    been vested: a zone's pointer vests no later than its oldest vested item.
    """

    def __init__(
        self,
        q: Quick,
        *,
        max_zones: int = GAUGE_ZONES_MAX,
        refresh_s: float = GAUGE_REFRESH_S,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_zones < 1:
            raise ValueError(f"max_zones must be at least 1, not {max_zones!r}")
        if not refresh_s >= 0:
            raise ValueError(f"refresh_s must be 0 or more seconds, not {refresh_s!r}")
        self.q = q
        self.max_zones = max_zones
        self.refresh_s = refresh_s
        self._now = now
        self._lock = threading.Lock()
        self._reading: tuple[float, list[Any]] | None = None

    def collect(self) -> Any:
        with self._lock:  # two scrapes at once read the store once
            t = self._now()
            if self._reading is None or t - self._reading[0] >= self.refresh_s:
                self._reading = (t, self._read())
            families = self._reading[1]
        yield from families

    def _read(self) -> list[Any]:
        _prometheus()
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily("quick_queue_depth", "Items in active zones", labels=["app"])
        oldest = GaugeMetricFamily(
            "quick_oldest_vested_age_seconds",
            "How long the app's longest-waiting vested pointer has waited",
            labels=["app"],
        )
        pointers = GaugeMetricFamily("quick_pointers", "Pointers per shard", labels=["shard"])
        complete = GaugeMetricFamily(
            "quick_store_gauges_complete",
            "1 when the last reading of the store's gauges saw every active zone, 0 when it "
            "stopped at its budget (the gauges are then lower bounds)",
        )
        q = self.q
        now_ms = int(q.clock.now() * 1000)
        q.toplevel.refresh_layout()  # a long-lived process sees a reshard
        left, whole = self.max_zones, True
        zones: list[Pointer] = []
        for shard in range(q.toplevel.shards):
            if left == 0:
                whole = whole and not q.toplevel.list_pointers(shard, limit=1)
                continue
            read = q.toplevel.list_pointers(shard, limit=left + 1)
            if len(read) > left:
                whole, read = False, read[:left]
            left -= len(read)
            pointers.add_metric([str(shard)], len(read))
            zones.extend(p for p in read if not p.local)
        by_app: dict[str, int] = {}
        age: dict[str, float] = {}
        for start in range(0, len(zones), COUNT_CHUNK):
            chunk = zones[start : start + COUNT_CHUNK]
            for pointer, count in zip(chunk, q.items.counts([p.zone for p in chunk]), strict=True):
                app = pointer.zone.app
                by_app[app] = by_app.get(app, 0) + count
                waited = 0.0
                if pointer.lease_id is None:
                    waited = max(0.0, (now_ms - pointer.vesting_ms) / 1000)
                age[app] = max(age.get(app, 0.0), waited)
        for app, n in sorted(by_app.items()):
            depth.add_metric([app], n)
            oldest.add_metric([app], age[app])
        complete.add_metric([], 1 if whole else 0)
        return [depth, oldest, pointers, complete]


def serve_metrics(q: Quick, port: int, addr: str = "127.0.0.1") -> PrometheusObserver:
    """Start the HTTP exporter and return the observer to hand to ``q.consumer``."""
    prom = _prometheus()
    observer = PrometheusObserver(job_types=q.registry)
    prom.REGISTRY.register(StoreCollector(q))
    prom.start_http_server(port, addr=addr)
    return observer


# Set in a child's environment by SharedMetrics: prometheus_client then keeps every metric
# of that process in files of this folder (read when prometheus_client is imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Internal, never typed by a user: set by SharedMetrics in the children of
# ``quick worker --processes N --metrics-port P`` (in their environment, not on their command
# lines), so each counts its metrics into the folder the supervisor serves on P instead of
# serving an endpoint of its own. PROMETHEUS_MULTIPROC_DIR alone would not do: an
# application may set it for its own reasons.
SHARED_ENV = "QUICK_METRICS_SHARED"


def shared_observer() -> PrometheusObserver | None:
    """A supervised child's observer: its metrics go to the folder its supervisor serves
    (:class:`SharedMetrics`), not to an endpoint of its own. None outside such a child."""
    if not os.environ.get(SHARED_ENV):
        return None
    if not os.environ.get(MULTIPROC_ENV):
        raise ConfigurationError(
            f"shared metrics need {MULTIPROC_ENV} set by the supervisor (quick worker --processes)"
        )
    return PrometheusObserver()


class SharedMetrics:
    """One metrics endpoint for all of a supervisor's children: a fresh folder their
    counters are written to (:attr:`env` goes into their environment), summed with the
    store's gauges at each scrape of ``addr:port``. :meth:`process_gone` after each child
    exits (its counts stay; its live gauges go), :meth:`close` at the end."""

    def __init__(self, q: Quick, port: int, addr: str = "127.0.0.1") -> None:
        prom = _prometheus()
        multiprocess: Any = importlib.import_module("prometheus_client.multiprocess")
        self._multiprocess = multiprocess
        self.folder = tempfile.mkdtemp(prefix="quick-metrics-")
        registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.folder)
        registry.register(StoreCollector(q))
        try:
            self._server = prom.start_http_server(port, addr=addr, registry=registry)
        except OSError:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @property
    def env(self) -> dict[str, str]:
        """What goes into the children's environment: the folder, and :data:`SHARED_ENV`."""
        return {MULTIPROC_ENV: self.folder, SHARED_ENV: "1"}

    def process_gone(self, pid: int) -> None:
        self._multiprocess.mark_process_dead(pid, self.folder)

    def close(self) -> None:
        server = self._server[0] if isinstance(self._server, tuple) else None
        if server is not None:
            server.shutdown()
        shutil.rmtree(self.folder, ignore_errors=True)
