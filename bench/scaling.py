"""Throughput against consumer processes (issue 29 point 4; the paper's Figure 4).

``python -m bench.scaling [--processes 1,2,4,8] [--workloads noop,sleep50] [--seconds S]
[--store fdb|postgres]``

For each workload and process count: a backlog over ``--tenants`` zones on FoundationDB
(``FDB_CLUSTER_FILE``, else a local ``fdbserver`` from ``FDB_BIN_DIR``) or, with ``--store
postgres``, on a private PostgreSQL server started for the run (fsync on, a schema per run,
issue 42's "--processes 2 against 1 on PostgreSQL"), sized from the
workers' bound (items/s the consumers could reach x the run's length x ``MARGIN``); then
``quick worker --processes N`` as a user starts it, with ``--metrics-port``: its one
endpoint counts every child's completions, pointer leases and lost pointer leases, read
at the start and the end of a steady window. A run whose backlog ran low (less than
``LEFT_AT_LEAST`` of it left at the window's end) reports the backlog's size, not the
consumers' rate: it fails, and the benchmark exits 1.

On PostgreSQL the server's side is read from its own statistics over the window: the
server processes' CPU (the postmaster and its backends), and per item the transactions it
committed and rolled back (``pg_stat_database``) and the statements it ran
(``pg_stat_statements``, loaded for the run: each is a round trip of a client, BEGIN and
COMMIT included), and the rows it inserted, updated and deleted.

Workloads: ``noop`` (no-op items, ``quick worker``'s defaults: ``ConsumerConfig()``) and
``sleep50`` (the paper's experiment (a): 50 ms items, 64 workers and 8 managers a
consumer). Results: one JSON file and a Markdown table in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bench.common import REPO, child_env, fdb_url, log
from bench.quickrun import NOOP, SLEEP, open_quick
from bench.servers import postgres_server
from quickzones.testing.provision.ports import free_port

MARGIN = 2.0  # backlog = bound x seconds x MARGIN
STARTUP_S = 10.0  # seconds from the workers' start to the window's, sized for too
LEFT_AT_LEAST = 0.1  # of the backlog at the window's end, or the run failed (drained)
# A no-op item's bound is the consumer process itself: above any rate one has reached
# (3,360 items/s with the throughput profile, 1,741 with the defaults, on the 16-core
# machine of issue 29).
NOOP_BOUND_PER_PROCESS = 4000.0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    job_type: str
    work_ms: float
    worker_args: tuple[str, ...]
    workers: int

    def bound(self, processes: int) -> float:
        """Items/s ``processes`` consumers could reach at most."""
        if self.work_ms <= 0:
            return NOOP_BOUND_PER_PROCESS * processes
        return processes * self.workers * 1000.0 / self.work_ms


WORKLOADS = {
    "noop": Workload("noop", NOOP, 0.0, (), 8),
    "sleep50": Workload("sleep50", SLEEP, 50.0, ("--workers", "64", "--managers", "8"), 64),
}


@dataclass(slots=True)
class Row:
    workload: str
    processes: int
    backlog: int
    items_per_s: float
    ratio_to_one: float | None
    pointer_leases: int
    pointer_leases_lost: int
    lost_share: float
    left_at_end: int
    drained: bool
    bound_items_per_s: float
    # Cores busy over the window: the consumer processes (the supervisor and its children)
    # and every fdbserver on the machine, so a ratio short of linear says where the cores went.
    consumer_cores: float = 0.0
    server_cores: float = 0.0
    busiest_server_core: float = 0.0  # one fdbserver near 1.0 is the cluster's bottleneck
    # The cluster's latency probe at the window's end (status json), in ms, and what its
    # ratekeeper says limits it: consumers that wait on a slower cluster show it here.
    probe_ms: dict[str, float] | None = None
    limited_by: str | None = None
    # Work an item costs over the window, summed over every consumer: each consumer event
    # (visits, pointer leases, batched visits...) and the cluster's transactions, conflicts,
    # reads and writes (status json's counters), per item completed. A count that grows
    # with the processes is work they add by contending, not by doing more items.
    per_item: dict[str, float] | None = None
    # CPU ms a fixed piece of pure-Python work took in this process during the window
    # (the median of a few samples): higher with more processes, the machine itself ran
    # slower with the consumers busy (clock, caches, a shared host), which raises their
    # CPU an item as much without any extra work of quick's.
    reference_ms: float | None = None


_SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$", re.M)


_EVENT = re.compile(r'event="(\w+)"')


def scrape(port: int) -> dict[str, float]:
    """The endpoint's completions, pointer leases and lost pointer leases, and every
    consumer event by kind (``event:<kind>``), summed over every process and label."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        body = resp.read().decode()
    out = {"completed": 0.0, "leased": 0.0, "lost": 0.0}
    for name, labels, value in _SAMPLE.findall(body):
        if name == "quick_events_total":
            kind = _EVENT.search(labels or "")
            if kind is not None:
                key = f"event:{kind.group(1)}"
                out[key] = out.get(key, 0.0) + float(value)
        if name == "quick_events_total" and 'event="completed"' in labels:
            out["completed"] += float(value)
        elif name == "quick_events_total" and 'event="pointer_leased"' in labels:
            out["leased"] += float(value)
        elif name == "quick_pointer_lease_failures_total":
            out["lost"] += float(value)
    return out


# status json's rates of the cluster's work, by the names this reports.
_CLUSTER_RATES = {
    "tx_started": ("transactions", "started"),
    "tx_committed": ("transactions", "committed"),
    "tx_conflicted": ("transactions", "conflicted"),
    "reads": ("operations", "reads"),
    "writes": ("operations", "writes"),
}


def per_item(begin: dict[str, float], end: dict[str, float], completed: float) -> dict[str, float]:
    """Each count's growth from ``begin`` to ``end`` per item completed."""
    if completed <= 0:
        return {}
    return {
        k: (end[k] - begin.get(k, 0.0)) / completed
        for k in sorted(end)
        if k not in ("completed", "leased", "lost") and end[k] != begin.get(k, 0.0)
    }


REFERENCE_SAMPLES = 5


def reference_ms() -> float:
    """CPU ms (this thread's) of a fixed piece of pure-Python work: the interpreter's
    own speed on this machine now, whatever else runs (a wait for a core is not CPU)."""
    started = time.thread_time()
    total = 0
    for n in range(200_000):
        total += n % 7
    return (time.thread_time() - started) * 1000


def _sleep_sampling(until: float, samples: list[float]) -> None:
    """Sleep until ``until`` (monotonic), taking REFERENCE_SAMPLES of :func:`reference_ms`
    spread over the time."""
    for k in range(REFERENCE_SAMPLES):
        time.sleep(max(0.0, (until - time.monotonic()) / (REFERENCE_SAMPLES - k)))
        samples.append(reference_ms())
    time.sleep(max(0.0, until - time.monotonic()))


def _cpu_seconds(procs: list[psutil.Process]) -> list[float]:
    out = []
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # one that ended in the window counts nothing
            out.append(0.0)
            continue
        out.append(t.user + t.system)
    return out


def _consumers(root: int) -> list[psutil.Process]:
    try:
        me = psutil.Process(root)
        return [me, *me.children(recursive=True)]
    except psutil.Error:
        return []


def _servers() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "fdbserver"]


# pg_stat_statements for the statement counts: loaded when the run's server starts.
PG_SETTINGS = ("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")


def _pg_servers(dsn: str) -> list[psutil.Process]:
    """The run's PostgreSQL server: its postmaster (the parent of a backend) and every
    process under it (the consumers' backends, connected by now, and the server's own)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert backend is not None
    try:
        postmaster = psutil.Process(psutil.Process(int(backend[0])).ppid())
        return [postmaster, *postmaster.children(recursive=True)]
    except psutil.Error:
        return []


def _pg_counters(dsn: str) -> dict[str, float]:
    """The server's counts so far: transactions committed and rolled back and rows written
    (``pg_stat_database``, every database), statements run (``pg_stat_statements``)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        row = conn.execute(
            "SELECT sum(xact_commit), sum(xact_rollback), sum(tup_inserted),"
            " sum(tup_updated), sum(tup_deleted) FROM pg_stat_database"
        ).fetchone()
        calls = conn.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements").fetchone()
    assert row is not None and calls is not None
    names = ("pg_commits", "pg_rollbacks", "pg_rows_inserted", "pg_rows_updated", "pg_rows_deleted")
    return {**{k: float(v or 0) for k, v in zip(names, row, strict=True)},
            "pg_statements": float(calls[0])}  # fmt: skip


def _cluster_status(
    url: str,
) -> tuple[dict[str, float] | None, str | None, dict[str, float]]:
    """The latency probe (start, read, commit, ms), the ratekeeper's limit and the
    cluster's work a second (transactions, reads, writes: status json's ``hz``, over the
    few seconds before; its counters move only every five seconds or so, too coarse for
    a window this short), read from the cluster's status json through the store's own
    FoundationDB connection."""
    q = open_quick(url)
    try:
        db = getattr(q.kv, "db", None)
        if db is None:
            return None, None, {}
        cluster = json.loads(bytes(db[b"\xff\xff/status/json"]))["cluster"]
        probe = cluster.get("latency_probe", {})
        names = {"transaction_start_seconds": "start", "read_seconds": "read",
                 "commit_seconds": "commit"}  # fmt: skip
        ms = {short: float(probe[k]) * 1000 for k, short in names.items() if k in probe}
        limit = cluster.get("qos", {}).get("performance_limited_by", {}).get("name")
        work = cluster.get("workload", {})
        rates = {}
        for name, (group, field) in _CLUSTER_RATES.items():
            hz = work.get(group, {}).get(field, {}).get("hz")
            if hz is not None:
                rates[name] = float(hz)
        return ms or None, limit, rates
    except Exception as err:  # a figure to report, never a reason to fail the run
        log(f"status json unreadable: {err}")
        return None, None, {}
    finally:
        q.close()


def _fill_tenants(url: str, job_type: str, work_ms: float, tenants: range, per: int) -> None:
    q = open_quick(url)
    payload = {"w": work_ms}
    for t in tenants:
        left = per
        while left > 0:  # one transaction stays far below FoundationDB's 10 MB
            n = min(left, 2000)
            q.enqueue_many(job_type, [payload] * n, app="s", tenant=f"z{t}")
            left -= n
    q.close()


def fill(url: str, job_type: str, work_ms: float, tenants: int, items: int) -> int:
    """``items`` items spread evenly over ``tenants`` zones of app ``s``, written by a
    process a core (spawned: a forked FoundationDB client is not safe)."""
    per = math.ceil(items / tenants)
    jobs = max(1, min(os.cpu_count() or 1, 16, tenants))
    parts = [range(i, tenants, jobs) for i in range(jobs)]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in [pool.submit(_fill_tenants, url, job_type, work_ms, r, per) for r in parts]:
            done.result()
    return per * tenants


def measure(
    workload: Workload,
    processes: int,
    seconds: float,
    warm_s: float,
    tenants: int,
    extra_args: tuple[str, ...] = (),
    postgres: str | None = None,
) -> Row:
    """One run; ``postgres``: the DSN of the PostgreSQL server to run on (else FoundationDB)."""
    tag = f"scale-{workload.name}-{processes}"
    url = fdb_url(tag) if postgres is None else f"{postgres}?schema={tag.replace('-', '_')}"
    # The processes' start and the scrapes (each reads every zone for the store's gauges)
    # come on top of the window: STARTUP_S of them at the bound too.
    backlog = math.ceil(workload.bound(processes) * (STARTUP_S + warm_s + seconds) * MARGIN)
    started = time.monotonic()
    backlog = fill(url, workload.job_type, workload.work_ms, tenants, backlog)
    log(f"{workload.name} x{processes}: {backlog:,} items in {time.monotonic() - started:.1f}s")
    port = free_port()
    env = child_env(QUICK_STORE=url)
    cmd = [
        sys.executable, "-m", "quickzones", "worker", "--app-module", "bench.user_app:q",
        "--processes", str(processes), "--metrics-port", str(port), *workload.worker_args,
        *extra_args,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        first: dict[str, float] | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                first = scrape(port)
            except OSError:
                first = None
            if first is not None and first["completed"] > 0:
                break
            time.sleep(0.2)
        if first is None or proc.poll() is not None:
            raise RuntimeError(f"quick worker --processes {processes} never completed an item")
        time.sleep(warm_s)
        # The counters are read first, the store's gauges (a read of every zone: seconds
        # over a big backlog) after them: the time a count holds at is the request's.
        consumers = _consumers(proc.pid)
        servers = _servers() if postgres is None else _pg_servers(postgres)
        t0 = time.monotonic()
        cpu0 = _cpu_seconds(consumers), _cpu_seconds(servers)
        pg0 = {} if postgres is None else _pg_counters(postgres)
        begin = scrape(port)
        reference: list[float] = []
        _sleep_sampling(t0 + seconds, reference)
        t1 = time.monotonic()
        cpu1 = _cpu_seconds(consumers), _cpu_seconds(servers)
        end = scrape(port)
        pg1 = {} if postgres is None else _pg_counters(postgres)
        if postgres is None:
            probe, limited_by, rates = _cluster_status(url)
        else:  # counts over the window, as rates: the same per-item division below
            probe, limited_by = None, None
            rates = {k: (pg1[k] - pg0.get(k, 0.0)) / (t1 - t0) for k in pg1}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        if postgres is None:
            _clear(url)  # the memory engine keeps everything in RAM: the next run starts empty
    leased = int(end["leased"] - begin["leased"])
    lost = int(end["lost"] - begin["lost"])
    left = backlog - int(end["completed"])
    items_per_s = (end["completed"] - begin["completed"]) / (t1 - t0)
    return Row(
        workload=workload.name,
        processes=processes,
        backlog=backlog,
        items_per_s=items_per_s,
        ratio_to_one=None,
        pointer_leases=leased,
        pointer_leases_lost=lost,
        lost_share=lost / (leased + lost) if leased + lost else 0.0,
        left_at_end=left,
        drained=left < LEFT_AT_LEAST * backlog,
        bound_items_per_s=workload.bound(processes),
        consumer_cores=(sum(cpu1[0]) - sum(cpu0[0])) / (t1 - t0),
        server_cores=(sum(cpu1[1]) - sum(cpu0[1])) / (t1 - t0),
        busiest_server_core=max(map(float.__sub__, cpu1[1], cpu0[1]), default=0.0) / (t1 - t0),
        probe_ms=probe,
        limited_by=limited_by,
        reference_ms=statistics.median(reference),
        per_item={
            **per_item(begin, end, end["completed"] - begin["completed"]),
            **{k: hz / items_per_s for k, hz in rates.items() if items_per_s > 0},
        },
    )


def _clear(url: str) -> None:
    """Every key of this run's store (its root prefix)."""
    from quickzones.store.kv import run as transact

    q = open_quick(url)
    try:
        transact(q.kv, lambda tr: tr.clear_range(b"", b"\xff"))
    finally:
        q.close()


def table(rows: list[Row]) -> str:
    lines = [
        "| workload | processes | items/s | x one | lost pointer leases | consumer cores |"
        " server cores | cluster latency ms (start/read/commit) | backlog | left | |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"x{r.ratio_to_one:.2f}" if r.ratio_to_one is not None else ""
        tries = r.pointer_leases + r.pointer_leases_lost
        lost = f"{r.lost_share:.1%} ({r.pointer_leases_lost}/{tries})"
        flag = "DRAINED: fails" if r.drained else ""
        lines.append(
            f"| {r.workload} | {r.processes} | {r.items_per_s:,.0f} | {ratio} | {lost} | "
            f"{r.consumer_cores:.2f} | {r.server_cores:.2f}"
            f" (busiest {r.busiest_server_core:.2f}) | {_probe(r)} | "
            f"{r.backlog:,} | {r.left_at_end:,} | {flag} |"
        )
    return "\n".join(lines)


def work_table(rows: list[Row]) -> str:
    """What an item cost in each run: one line a count (consumer events, the cluster's
    transactions and operations), one column a run, per item completed; consumer CPU
    an item (ms) first."""
    runs = [r for r in rows if r.per_item]
    if not runs:
        return ""
    names = sorted({k for r in runs for k in r.per_item or {}})
    head = " | ".join(f"{r.workload} x{r.processes}" for r in runs)
    lines = [f"| per item | {head} |", "|---" * (len(runs) + 1) + "|"]
    cpu = " | ".join(
        f"{1000 * r.consumer_cores / r.items_per_s:.3f}" if r.items_per_s else "" for r in runs
    )
    lines.append(f"| consumer CPU ms | {cpu} |")
    ref = " | ".join(f"{r.reference_ms:.2f}" if r.reference_ms else "" for r in runs)
    lines.append(f"| reference work, CPU ms (the machine's speed: not an item's) | {ref} |")
    for name in names:
        cells = " | ".join(f"{(r.per_item or {}).get(name, 0.0):.3f}" for r in runs)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def _probe(r: Row) -> str:
    if not r.probe_ms:
        return ""
    ms = "/".join(f"{r.probe_ms.get(k, float('nan')):.1f}" for k in ("start", "read", "commit"))
    return f"{ms} ({r.limited_by})" if r.limited_by else ms


def write(out: Path | None, rows: list[Row], meta: dict[str, object]) -> None:
    """scaling.json and scaling.md in ``out``, rewritten after each run: a run cut short
    (a time limit) still leaves the rows measured so far."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "cores": os.cpu_count(), "rows": [asdict(r) for r in rows]}
    (out / "scaling.json").write_text(json.dumps(doc, indent=2))
    (out / "scaling.md").write_text(table(rows) + "\n\n" + work_table(rows) + "\n")


def run(
    processes: list[int],
    workloads: list[str],
    seconds: float,
    warm_s: float,
    tenants: int,
    out: Path | None = None,
    extra_args: tuple[str, ...] = (),
    postgres: str | None = None,
) -> list[Row]:
    meta: dict[str, object] = {"argv": sys.argv, "seconds": seconds, "warm_s": warm_s,
                               "tenants": tenants, "worker_args": extra_args,
                               "store": "fdb" if postgres is None else "postgres"}  # fmt: skip
    rows: list[Row] = []
    for name in workloads:
        one: float | None = None
        for n in processes:
            row = measure(WORKLOADS[name], n, seconds, warm_s, tenants, extra_args, postgres)
            if n == 1:
                one = row.items_per_s
            row.ratio_to_one = row.items_per_s / one if one else None
            rows.append(row)
            write(out, rows, meta)
            log(
                f"{name} x{n}: {row.items_per_s:,.0f} items/s"
                f"{f' (x{row.ratio_to_one:.2f})' if row.ratio_to_one else ''}, "
                f"lost pointer leases {row.lost_share:.1%}, cores: consumers "
                f"{row.consumer_cores:.2f}, server {row.server_cores:.2f}"
                f"{'; DRAINED: the backlog ran low, not the consumers' if row.drained else ''}"
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    ap.add_argument("--processes", default="1,2,4,8", help="comma-separated counts")
    ap.add_argument("--workloads", default="noop,sleep50", help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--seconds", type=float, default=8.0, help="the measuring window")
    ap.add_argument("--warm", type=float, default=2.0, help="seconds before the window")
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None, help="folder for scaling.json/.md")
    ap.add_argument("--worker-args", default="", help="more `quick worker` options, one string")
    ap.add_argument("--store", choices=("fdb", "postgres"), default="fdb")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.processes.split(",")]
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or any(n < 1 for n in counts):
        ap.error(f"unknown workloads {unknown}" if unknown else "processes must be >= 1")
    extra = tuple(shlex.split(args.worker_args))
    with contextlib.ExitStack() as servers:
        postgres = None
        if args.store == "postgres":
            postgres = servers.enter_context(postgres_server(settings=PG_SETTINGS))
        rows = run(counts, names, args.seconds, args.warm, args.tenants, args.out, extra, postgres)
    print(table(rows))
    print()
    print(work_table(rows))
    drained = [r for r in rows if r.drained]
    if drained:
        log(f"{len(drained)} run(s) drained their backlog: their rates are not the consumers'")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
