"""What users see, beside the peers (issue 44 point 6): the figures docs/performance.md
leads with.

``python -m bench.peers_users [--runs 3] [--jobs 5000] [--only quick-sqlite,huey,...]
[--work-ms 0] [--out DIR]``

Each system runs as a user runs it: quick is ``quick worker --workers 4`` with every other
setting at its default (:mod:`bench.user_app`), on SQLite and on PostgreSQL; the peers are
their own CLI workers with 4 threads (Huey on SQLite, Dramatiq on Redis) or concurrency 4
(procrastinate, on the PostgreSQL server quick uses), each with the polling settings of
its adapter in ``bench/peers/`` (faster than their defaults: that favours the peers). Jobs
are no-ops (``--work-ms`` to give them work) and every enqueue is one call for one job: no
batch API, no tuned profile (``python -m bench --only peers`` keeps those). Per system and
run, in this order:

(a) **enqueue**: ``--jobs`` jobs of one tenant, one call each, no worker running: jobs/s;
(b) **drain**: then one worker process spawned, timed from just before its spawn to the
    last job's *end* (each job appends its end to a file, :func:`bench.common.record_start`),
    start-up included: jobs/s (:func:`bench.peer_workloads.enqueue_then_drain`);
(c) **noisy neighbour**, the worker running: one tenant's burst of 3/5 x ``--jobs`` jobs
    (3,000), one call each, while 50 small tenants enqueue ``--jobs`` / 500 jobs each (10)
    at random times over 5 s (scaled down below 5,000 jobs), one call each; pickup
    (enqueue to start) p50/p99 of the small tenants and of the noisy one
    (:func:`bench.peer_workloads.noisy_neighbour`);
(d) **delayed**: ``--jobs`` / 10 jobs (500) each delayed U(0.5, 3) s; lateness (start -
    due) p50/p99 and how many started early (:func:`bench.peer_workloads.delayed`).

Runs rotate the order of the systems (A B C, B C A, ...) so a busy stretch of a shared host
falls on all. Reported: medians and min-max over runs, quick's median over the best
peer's for each row, and the load average around each step. Results: a table on stdout
and in ``bench/results/<UTC timestamp>-peers-users/`` (``table.md``,
``peers_users.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import peer_workloads as w
from bench.common import compile_bytecode, log, machine, run_folder, summary
from bench.peers.base import Peer

SYSTEMS = (
    "quick-sqlite",
    "quick-sqlzones",
    "quick-postgres",
    "quick-pgzones",
    "huey",
    "dramatiq",
    "procrastinate",
)
QUICKS = ("quick-sqlite", "quick-sqlzones", "quick-postgres", "quick-pgzones")
LABELS = {
    "quick-sqlite": "quick (SQLite)",
    "quick-sqlzones": "quick (SQLite, zones=sql)",
    "quick-postgres": "quick (PostgreSQL)",
    "quick-pgzones": "quick (PostgreSQL, zones=sql)",
    "huey": "Huey (SQLite)",
    "dramatiq": "Dramatiq (Redis)",
    "procrastinate": "procrastinate (PostgreSQL)",
}
WORKERS = 4
SMALL_TENANTS = 50
LONE = "lone"
DELAY_S = (0.5, 3.0)

# (key, row label, unit, whether higher is better: None when no ratio is meaningful)
ROWS: tuple[tuple[str, str, str, bool | None], ...] = (
    ("enqueue_per_s", "enqueue, one call a job", "/s", True),
    # Measured with --enqueue-only (the producer's process_time per call).
    ("enqueue_cpu_ms", "enqueue, producer CPU per call", " ms", False),
    ("drain_per_s", "drain, worker spawn to last job's end", "/s", True),
    # The worker process's CPU for that drain, start-up and stop included.
    ("drain_cpu_s", "drain, the worker process's CPU", " s", False),
    ("small_p50", "noisy neighbour, small tenants' pickup p50", " ms", False),
    ("small_p99", "noisy neighbour, small tenants' pickup p99", " ms", False),
    ("noisy_p50", "noisy neighbour, noisy tenant's pickup p50", " ms", None),
    ("delayed_p50", "delayed jobs, lateness p50", " ms", False),
    ("delayed_p99", "delayed jobs, lateness p99", " ms", False),
    ("delayed_early", "delayed jobs started early", "", None),
)


# The peers' own packages, compiled beside quick's before a sitting (compile_bytecode).
PEER_PACKAGES = ("huey", "dramatiq", "procrastinate", "psycopg", "redis")


def sizes(jobs: int) -> dict[str, Any]:
    """The workloads' sizes for ``jobs`` (the issue's at 5,000)."""
    return {
        "jobs": jobs,
        "noisy": jobs * 3 // 5,
        "small_tenants": SMALL_TENANTS,
        "per_small": max(1, jobs // 500),
        "window_s": max(1.0, 5.0 * jobs / 5000),
        "delayed": max(10, jobs // 10),
        "delay_s": list(DELAY_S),
    }


def order_of_run(systems: list[str], run: int) -> list[str]:
    """Run ``run``'s order: the list rotated by one more each run."""
    k = run % len(systems) if systems else 0
    return systems[k:] + systems[:k]


@contextmanager
def _servers(systems: list[str], flush_delay_ms: float) -> Iterator[dict[str, str]]:
    """Only the servers the chosen systems need (bench.servers: private, always stopped).
    ``flush_delay_ms``: PostgreSQL holds every durable commit that long before its WAL
    flush (``commit_delay`` with ``commit_siblings`` 0), as a disk whose flush is that much
    slower would; commits made with ``synchronous_commit = off`` do not wait for it."""
    from bench.servers import postgres_server, redis_server

    with ExitStack() as stack:
        urls: dict[str, str] = {}
        if "dramatiq" in systems:
            urls["redis"] = stack.enter_context(redis_server())
        if {"quick-postgres", "quick-pgzones", "procrastinate"} & set(systems):
            delay_us = round(flush_delay_ms * 1000)
            settings = (f"commit_delay={delay_us}", "commit_siblings=0") if delay_us else ()
            urls["postgres"] = stack.enter_context(postgres_server(settings))
        yield urls


def _makers(urls: dict[str, str]) -> dict[str, Callable[[Path], Peer]]:
    """Each system's peer adapter (bench/peers/), imported only when it runs: a peer whose
    package is missing is reported as failed and the others still run."""

    def quick_sqlite(d: Path) -> Peer:
        from bench.peers.quick_peer import QuickPeer, user_consumer

        peer = QuickPeer(d, "sqlite", consumer=user_consumer(WORKERS))
        peer.config = f"quick worker --workers {WORKERS} (defaults)"
        return peer

    def quick_sqlzones(d: Path) -> Peer:
        from bench.peers.quick_peer import QuickPeer, user_consumer

        peer = QuickPeer(d, "sqlite", consumer=user_consumer(WORKERS), zones="sql")
        peer.config = f"quick worker --workers {WORKERS} (defaults), store URL ?zones=sql"
        return peer

    def quick_postgres(d: Path) -> Peer:
        from bench.postgres_peer import PostgresQuickPeer

        return PostgresQuickPeer(d, urls["postgres"], "users", WORKERS)

    def quick_pgzones(d: Path) -> Peer:
        from bench.postgres_peer import PostgresQuickPeer

        return PostgresQuickPeer(d, urls["postgres"], "userszones", WORKERS, zones="sql")

    def huey(d: Path) -> Peer:
        from bench.peers.huey_peer import HueyPeer

        return HueyPeer(d, workers=WORKERS)

    def dramatiq(d: Path) -> Peer:
        from bench.peers.dramatiq_peer import DramatiqPeer

        return DramatiqPeer(d, urls["redis"], threads=WORKERS)

    def procrastinate(d: Path) -> Peer:
        from bench.postgres_peer import _procrastinate

        peer: Peer = _procrastinate(d, urls["postgres"], WORKERS)
        return peer

    return {
        "quick-sqlite": quick_sqlite,
        "quick-sqlzones": quick_sqlzones,
        "quick-postgres": quick_postgres,
        "quick-pgzones": quick_pgzones,
        "huey": huey,
        "dramatiq": dramatiq,
        "procrastinate": procrastinate,
    }


def enqueue_only(peer: Peer, jobs: int) -> dict[str, Any]:
    """(a) alone (``--enqueue-only``): the rate of one-call enqueues and this process's CPU
    per enqueue (``time.process_time``: the producer's, every thread of it)."""
    loads = [os.getloadavg()[0]]
    peer.reset()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(jobs):
        peer.enqueue(LONE)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    loads.append(os.getloadavg()[0])
    return {
        "enqueue_per_s": jobs / wall,
        "enqueue_cpu_ms": cpu * 1000 / jobs,
        "loadavg": [round(x, 2) for x in loads],
    }


def one_run(peer: Peer, s: dict[str, Any], work_ms: float) -> dict[str, Any]:
    """(a)-(d) on one system, in order."""
    loads = [os.getloadavg()[0]]
    res = w.enqueue_then_drain(peer, s["jobs"], LONE)
    loads.append(os.getloadavg()[0])
    noisy = w.noisy_neighbour(
        peer,
        s["per_small"],
        s["window_s"],
        work_ms,
        small_tenants=s["small_tenants"],
        noisy_total=s["noisy"],
        noisy_batch=1,
    )
    if noisy["ran"] != noisy["expected"]:
        raise RuntimeError(f"{peer.name}: {noisy['ran']} of {noisy['expected']} jobs ran")
    res["noisy"] = noisy
    loads.append(os.getloadavg()[0])
    lo, hi = s["delay_s"]
    res["delayed"] = w.delayed(peer, s["delayed"], lo, hi)
    if res["delayed"]["n"] != s["delayed"]:
        raise RuntimeError(f"{peer.name}: {res['delayed']['n']} of {s['delayed']} delayed ran")
    loads.append(os.getloadavg()[0])
    res["loadavg"] = [round(x, 2) for x in loads]
    return res


def _flat(run: dict[str, Any]) -> dict[str, float]:
    nan = float("nan")
    if "drain" not in run:  # --enqueue-only
        flat = {key: nan for key, *_ in ROWS}
        return {
            **flat,
            "enqueue_per_s": run["enqueue_per_s"],
            "enqueue_cpu_ms": run["enqueue_cpu_ms"],
        }
    return {
        "enqueue_per_s": run["enqueue_per_s"],
        "enqueue_cpu_ms": nan,
        "drain_per_s": run["drain"]["per_s"],
        "drain_cpu_s": run["drain"].get("worker_cpu_s", nan),
        "small_p50": run["noisy"]["small"]["p50"],
        "small_p99": run["noisy"]["small"]["p99"],
        "noisy_p50": run["noisy"]["noisy"]["p50"],
        "delayed_p50": run["delayed"]["p50"],
        "delayed_p99": run["delayed"]["p99"],
        "delayed_early": run["delayed"]["early"],
    }


def summarize(systems: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per system and row: median, min, max over the runs that completed."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, system in systems.items():
        flats = [_flat(r) for r in system.get("runs", [])]
        if flats:
            out[name] = {key: summary([f[key] for f in flats]) for key, *_ in ROWS}
    return out


def ratios(summ: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """For each quick and each row with a direction: quick's median over the best peer's
    (the highest rate, the lowest latency): above 1 is better for a rate, below 1 for a
    latency."""
    peers = [n for n in summ if n not in QUICKS]
    out: dict[str, dict[str, Any]] = {}
    for quick in (q for q in QUICKS if q in summ):
        out[quick] = {}
        for key, _label, _unit, higher in ROWS:
            if higher is None or not peers:
                continue
            pick = max if higher else min
            best = pick(peers, key=lambda p: summ[p][key]["median"])
            peer_median = summ[best][key]["median"]
            ratio = summ[quick][key]["median"] / peer_median if peer_median else float("nan")
            out[quick][key] = {"peer": best, "ratio": ratio}
    return out


def _num(x: float) -> str:
    if x != x:  # NaN
        return "-"
    if abs(x) >= 10 or x == int(x):
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.3f}"  # CPU per enqueue: a fraction of a ms


def table(summ: dict[str, Any], rat: dict[str, Any]) -> str:
    names = [n for n in SYSTEMS if n in summ]
    quicks = [q for q in QUICKS if q in rat]
    head = ["what", *(LABELS[n] for n in names), *(f"{LABELS[q]} / best peer" for q in quicks)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, unit, _higher in ROWS:
        if all(summ[n][key]["median"] != summ[n][key]["median"] for n in names):
            continue  # not measured in this mode (NaN)
        cells = [label]
        for n in names:
            m = summ[n][key]
            spread = f" ({_num(m['min'])}-{_num(m['max'])})" if m["n"] > 1 else ""
            cells.append(f"{_num(m['median'])}{unit}{spread}")
        for q in quicks:
            r = rat[q].get(key)
            cells.append(f"{r['ratio']:.2f}x {r['peer']}" if r else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Medians of runs (min-max). Last columns: quick's median over the best peer's, "
        "above 1 better for a rate (/s), below 1 better for a time (ms).",
    ]
    return "\n".join(lines) + "\n"


def run(
    runs: int,
    jobs: int,
    only: list[str],
    work_ms: float,
    enqueues: bool,
    flush_delay_ms: float,
) -> dict[str, Any]:
    s = sizes(jobs)
    res: dict[str, Any] = {
        "sizes": {**s, "work_ms": work_ms, "enqueue_only": enqueues},
        "pg_flush_delay_ms": flush_delay_ms,
        "runs": runs,
        "systems": {},
        "loadavg": {"before": list(os.getloadavg())},
    }
    # Every system starts from bytecode, as installed from a wheel (compile_bytecode).
    res["bytecode"] = compile_bytecode(PEER_PACKAGES)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-users-")))
        urls = stack.enter_context(_servers(only, flush_delay_ms))
        makers = _makers(urls)
        peers: dict[str, Peer] = {}
        for name in only:
            workdir = tmp / name
            workdir.mkdir()
            try:
                peers[name] = peer = stack.enter_context(_closing(makers[name](workdir)))
                res["systems"][name] = {
                    "config": peer.config,
                    "worker": shlex.join(peer.worker_cmd()),
                    "runs": [],
                }
            except Exception as err:  # one broken peer must not sink the others
                log(f"{name} failed to start: {err!r}")
                traceback.print_exc()
                res["systems"][name] = {"error": repr(err)}
        for r in range(runs):
            for name in order_of_run(list(peers), r):
                system = res["systems"][name]
                try:
                    if enqueues:
                        one = enqueue_only(peers[name], jobs)
                        system["runs"].append(one)
                        log(
                            f"run {r + 1}/{runs} {name}: enqueue {one['enqueue_per_s']:.0f}/s,"
                            f" {one['enqueue_cpu_ms']:.3f} ms CPU each, load {one['loadavg']}"
                        )
                        continue
                    one = one_run(peers[name], s, work_ms)
                except Exception as err:
                    log(f"{name} run {r + 1} failed: {err!r}")
                    traceback.print_exc()
                    system.setdefault("errors", []).append(repr(err))
                    continue
                system["runs"].append(one)
                f = _flat(one)
                log(
                    f"run {r + 1}/{runs} {name}: enqueue {f['enqueue_per_s']:.0f}/s, drain "
                    f"{f['drain_per_s']:.0f}/s, small p50/p99 {f['small_p50']:.1f}/"
                    f"{f['small_p99']:.1f} ms, delayed p99 {f['delayed_p99']:.1f} ms "
                    f"({f['delayed_early']:.0f} early), load {one['loadavg']}"
                )
    res["loadavg"]["after"] = list(os.getloadavg())
    res["summary"] = summarize(res["systems"])
    res["ratios"] = ratios(res["summary"])
    return res


@contextmanager
def _closing(peer: Peer) -> Iterator[Peer]:
    try:
        yield peer
    finally:
        peer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers_users", description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--only", default=",".join(SYSTEMS), help=f"among {','.join(SYSTEMS)}")
    ap.add_argument("--work-ms", type=float, default=0.0, help="each job sleeps this long")
    ap.add_argument("--out", default=None, help="results folder")
    ap.add_argument(
        "--enqueue-only",
        action="store_true",
        help="(a) alone: one-call enqueue rates and the producer's CPU per enqueue",
    )
    ap.add_argument(
        "--pg-flush-delay-ms",
        type=float,
        default=0.0,
        help="PostgreSQL holds each durable commit this long before its WAL flush (max 100), "
        "as a slower disk would (network storage: 1-5 ms); this VM's flush is about 0.2 ms",
    )
    args = ap.parse_args(argv)
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - set(SYSTEMS))
    if unknown:
        ap.error(f"unknown systems {', '.join(unknown)}: choose among {', '.join(SYSTEMS)}")
    if args.runs < 1 or args.jobs < 10:
        ap.error("--runs must be at least 1 and --jobs at least 10")
    if not 0 <= args.pg_flush_delay_ms <= 100:
        ap.error("--pg-flush-delay-ms must be between 0 and 100 (commit_delay's limit)")
    t0 = time.time()
    res = run(args.runs, args.jobs, only, args.work_ms, args.enqueue_only, args.pg_flush_delay_ms)
    res["machine"] = machine()
    res["command"] = "python -m bench.peers_users " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    res["duration_s"] = round(time.time() - t0, 1)
    text = table(res["summary"], res["ratios"])
    out = run_folder("peers-users", args.out)
    (out / "peers_users.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "table.md").write_text(text)
    print(text)
    failed = [n for n, s in res["systems"].items() if "error" in s or s.get("errors")]
    load = res["loadavg"]
    log(
        f"load average {load['before'][0]:.1f} before, {load['after'][0]:.1f} after; "
        f"{res['duration_s']:.0f} s; results in {out}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    # SIGTERM becomes SystemExit so the context managers stop the servers and workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
