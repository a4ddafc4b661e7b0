"""quick on PostgreSQL against procrastinate on the same server (issue 30's targets).

``python -m bench.postgres_peer [--rounds 3] [--n 5000] [--workers 4] [--tx 300]
[--dequeue-max N] [--out DIR]``

One private PostgreSQL cluster (:func:`bench.servers.postgres_server`: ``initdb`` in a
temporary folder, fsync on as a deployment has it) holds both systems. Each round runs,
the two systems' order alternating round by round so a noisy stretch of the shared host
falls on both:

(a) **lone tenant**: one tenant's ``--n`` no-op items stored first, then drained by one
    worker process: ``quick worker --workers 4`` with every other setting at its default
    (:mod:`bench.user_app`, a fresh schema of the cluster) against ``procrastinate worker
    --concurrency 4`` (:mod:`bench.peers.procrastinate_peer`: LISTEN/NOTIFY, finished
    jobs deleted). The rate is (n - 1) / (last start - first start) from the jobs' own
    start records, the same measure for both (:func:`bench.lone_tenant.user_rate`);
    ``--dequeue-max N`` adds quick worker with that one option changed (after the two);
(b) **noisy neighbour** (peer workload (ii), :func:`bench.peer_workloads.noisy_neighbour`,
    as ``bench.noisy_pickup`` runs it on SQLite): 100 small tenants x 10 items over 5 s
    beside one tenant's 1,000-item burst, jobs sleep 5 ms; the small tenants' pickup p99.
    Procrastinate runs **plain FIFO**: it has no per-tenant fairness to configure. Its
    worker fetches ``ORDER BY priority DESC, id ASC`` across every queue it listens to,
    so a queue per tenant would change nothing, and a queueing lock refuses a second
    queued job with the same lock (it would drop the burst, not share the worker);
(c) **enqueue in the application's transaction**: a psycopg connection's transaction
    inserting one row into an application table, alone and with ``Quick.enqueue_on``
    in it (one of 100 tenants in turn), the two alternating transaction by transaction;
    no consumer runs. The added time is the difference of the medians (and, beside it,
    the median of the paired differences).

Targets (issue 30): (a) quick at least 2x procrastinate's rate; (b) quick's small-tenant
p99 at most 50 ms; (c) at most 1 ms added at the median. Results on stdout and in
``bench/results/<UTC timestamp>-postgres-peer/postgres_peer.json``. Compare within a run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import peer_workloads as w
from bench.common import REPO, log, machine, run_folder, summary
from bench.lone_tenant import TENANT, _drain, _store_backlog, user_rate
from bench.peers.quick_peer import QuickPeer, user_consumer
from bench.quickrun import JOB, open_quick, user_worker_cmd
from bench.servers import postgres_server

TARGET_RATIO = 2.0
TARGET_P99_MS = 50.0
TARGET_ADDED_MS = 1.0
SYSTEMS = ("quick", "procrastinate")


def _schema_url(dsn: str, schema: str) -> str:
    return f"{dsn}?schema={schema}"


class PostgresQuickPeer(QuickPeer):
    """quick on the bench's PostgreSQL, a fresh schema per reset, consumed by ``quick
    worker --workers N`` with its defaults (as :mod:`bench.noisy_pickup` runs it)."""

    def __init__(
        self, workdir: Path, dsn: str, tag: str, workers: int, *, zones: str = "kv"
    ) -> None:
        """``zones``: ``sql`` opens each schema with ``zones=sql`` (items and pointers in
        tables of their own)."""
        self.dsn = dsn
        self.tag = tag

        super().__init__(workdir, "postgres", consumer=user_consumer(workers), zones=zones)
        self.config = f"quick worker --workers {workers} (defaults)" + (
            "" if zones == "kv" else f", store URL &zones={zones}"
        )

    def _url(self) -> str:
        url = _schema_url(self.dsn, f"{self.tag}_{self.generation}")
        return url if self.zones == "kv" else f"{url}&zones={self.zones}"


def _procrastinate(workdir: Path, dsn: str, workers: int) -> Any:
    from bench.peers import procrastinate_tasks
    from bench.peers.procrastinate_peer import ProcrastinatePeer

    # A fresh App (and pool) on this server: the module reads the DSN as it is imported.
    os.environ["BENCH_PG_DSN"] = dsn
    importlib.reload(procrastinate_tasks)
    return ProcrastinatePeer(workdir, dsn, concurrency=workers)


# --- (a) one tenant's backlog drained ----------------------------------------------------


def lone_quick(
    dsn: str, n: int, work: Path, workers: int, tag: str, dequeue_max: int | None = None
) -> float:
    """``quick worker --workers N`` with its defaults; with ``dequeue_max``, that one
    option changed too (how many items one visit of the zone takes: one tenant's zone is
    visited by one manager at a time, so the visit's size bounds the rate)."""
    url = _schema_url(dsn, tag)
    if dequeue_max is None:
        return user_rate(url, n, work, workers)
    out = _store_backlog(url, n, work)
    env = {**os.environ, "BENCH_OUT": str(out), "PYTHONPATH": str(REPO), "QUICK_STORE": url}
    cmd = [*user_worker_cmd(workers), "--dequeue-max", str(dequeue_max)]
    return _drain(cmd, env, out, n, work / "quick-worker.log")


def lone_procrastinate(dsn: str, n: int, work: Path, workers: int) -> float:
    peer = _procrastinate(work, dsn, workers)
    try:
        peer.reset()
        for i in range(0, n, 500):
            peer.enqueue_batch(TENANT, min(500, n - i))
        peer.out.write_bytes(b"")
        return _drain(peer.worker_cmd(), peer.env, peer.out, n, work / "procrastinate.log")
    finally:
        peer.close()


# --- (b) the noisy neighbour -------------------------------------------------------------


def noisy(peer: Any) -> dict[str, float]:
    try:
        r = w.noisy_neighbour(peer, per_small=10, window_s=5.0, work_ms=5.0)
    finally:
        peer.close()
    if r["ran"] != r["expected"]:
        raise RuntimeError(f"{peer.name}: {r['ran']} of {r['expected']} items ran")
    return w.flat_noisy(r)


# --- (c) an enqueue inside the application's transaction ---------------------------------


def enqueue_in_transaction(dsn: str, tag: str, n: int) -> dict[str, Any]:
    """``n`` application transactions of each kind, alternating; times in ms."""
    import psycopg

    q = open_quick(_schema_url(dsn, tag))
    plain: list[float] = []
    joined: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY,"
            " tenant text NOT NULL, total_cents int NOT NULL)"
        )
        insert = "INSERT INTO bench_orders (tenant, total_cents) VALUES (%s, %s)"

        def one(i: int, enqueue: bool) -> float:
            tenant = f"t{i % 100}"
            t0 = time.perf_counter()
            with conn.transaction():
                conn.execute(insert, (tenant, i))
                if enqueue:
                    t = time.time()
                    payload = {"t": tenant, "e": t, "d": t}
                    q.enqueue_on(conn, JOB, payload, app="b", tenant=tenant)
            return (time.perf_counter() - t0) * 1000

        for i in range(50):  # warm-up: connections, plans, every tenant's pointer
            one(i, True)
            one(i, False)
        for i in range(n):
            first = i % 2 == 0  # which kind goes first alternates
            a = one(i, first)
            b = one(i, not first)
            with_ms, without_ms = (a, b) if first else (b, a)
            joined.append(with_ms)
            plain.append(without_ms)
    q.close()
    diffs = [a - b for a, b in zip(joined, plain, strict=True)]
    return {
        "n": n,
        "without_p50_ms": statistics.median(plain),
        "with_p50_ms": statistics.median(joined),
        "added_ms": statistics.median(joined) - statistics.median(plain),
        "paired_added_p50_ms": statistics.median(diffs),
    }


# --- the run -------------------------------------------------------------------------------


def _medians(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return summary([r[key] for r in rounds])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.postgres_peer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=5000, help="the lone tenant's items")
    ap.add_argument("--workers", type=int, default=4, help="quick's --workers, procrastinate's -c")
    ap.add_argument("--tx", type=int, default=300, help="application transactions of each kind")
    ap.add_argument(
        "--dequeue-max",
        type=int,
        default=0,
        help="(a) also runs quick worker with this --dequeue-max (0: not)",
    )
    ap.add_argument("--out", default="", help="results directory")
    args = ap.parse_args(argv)
    lone: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    tuned = f"quick-dequeue-max-{args.dequeue_max}"
    if args.dequeue_max:
        lone[tuned] = []
    noisy_runs: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    tx_runs: list[dict[str, Any]] = []
    with postgres_server() as dsn, tempfile.TemporaryDirectory(prefix="bench-pg-peer-") as tmp:
        for r in range(args.rounds):
            order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
            for name in order:
                work = Path(tmp) / f"lone-{name}-{r}"
                work.mkdir()
                if name == "quick":
                    rate = lone_quick(dsn, args.n, work, args.workers, f"lone_{r}")
                else:
                    rate = lone_procrastinate(dsn, args.n, work, args.workers)
                lone[name].append(rate)
                log(f"round {r + 1}/{args.rounds} lone tenant {name}: {rate:.0f} items/s")
            if args.dequeue_max:
                work = Path(tmp) / f"lone-tuned-{r}"
                work.mkdir()
                rate = lone_quick(
                    dsn, args.n, work, args.workers, f"lone_tuned_{r}", args.dequeue_max
                )
                lone[tuned].append(rate)
                log(f"round {r + 1}/{args.rounds} lone tenant {tuned}: {rate:.0f} items/s")
            for name in order:
                work = Path(tmp) / f"noisy-{name}-{r}"
                work.mkdir()
                peer = (
                    PostgresQuickPeer(work, dsn, f"noisy_{r}", args.workers)
                    if name == "quick"
                    else _procrastinate(work, dsn, args.workers)
                )
                one = noisy(peer)
                noisy_runs[name].append(one)
                log(
                    f"round {r + 1}/{args.rounds} noisy {name}: small p50 "
                    f"{one['small_p50']:.1f} p99 {one['small_p99']:.1f} ms; noisy p50 "
                    f"{one['noisy_p50']:.0f} ms"
                )
            tx = enqueue_in_transaction(dsn, f"app_{r}", args.tx)
            tx_runs.append(tx)
            log(
                f"round {r + 1}/{args.rounds} app transaction: {tx['without_p50_ms']:.3f} ms "
                f"alone, {tx['with_p50_ms']:.3f} ms with enqueue_on: +{tx['added_ms']:.3f} ms"
            )
    rates = {s: summary(v) for s, v in lone.items()}
    ratio = rates["quick"]["median"] / rates["procrastinate"]["median"]
    noisy_fields = ("small_p50", "small_p99", "small_max", "noisy_p50", "burst_s")
    noisy_summary = {
        s: {f: summary([x[f] for x in runs]) for f in noisy_fields}
        for s, runs in noisy_runs.items()
    }
    quick_p99 = noisy_summary["quick"]["small_p99"]["median"]
    added = _medians(tx_runs, "added_ms")
    res: dict[str, Any] = {
        "command": "python -m bench.postgres_peer " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "rounds": args.rounds,
        "setup": {
            "quick": f"quick worker --workers {args.workers} (defaults), postgresql:// store",
            "procrastinate": f"procrastinate worker --concurrency {args.workers} -p 0.1 "
            "--delete-jobs successful (LISTEN/NOTIFY); plain FIFO",
            "server": "one private PostgreSQL cluster (initdb, fsync on), both systems",
        },
        "lone_tenant": {"n": args.n, "rates": rates, "ratio_quick_to_procrastinate": ratio},
        "noisy_neighbour": {"summary": noisy_summary, "per_run": noisy_runs},
        "enqueue_in_transaction": {
            "added_ms": added,
            "paired_added_p50_ms": _medians(tx_runs, "paired_added_p50_ms"),
            "without_p50_ms": _medians(tx_runs, "without_p50_ms"),
            "with_p50_ms": _medians(tx_runs, "with_p50_ms"),
            "per_run": tx_runs,
        },
        "targets": {
            "lone_ratio_at_least_2": ratio >= TARGET_RATIO,
            "small_p99_at_most_50_ms": quick_p99 <= TARGET_P99_MS,
            "added_at_most_1_ms": added["median"] <= TARGET_ADDED_MS,
        },
    }
    out = run_folder("postgres-peer", args.out)
    (out / "postgres_peer.json").write_text(json.dumps(res, indent=1))
    q, p = rates["quick"], rates["procrastinate"]
    pq, pp = noisy_summary["quick"]["small_p99"], noisy_summary["procrastinate"]["small_p99"]
    met = {True: "met", False: "NOT met"}
    lines = [
        f"postgres peer, {args.rounds} rounds (medians; min-max)",
        f"(a) lone tenant {args.n} no-op items/s: quick {q['median']:.0f} ({q['min']:.0f}-"
        f"{q['max']:.0f}), procrastinate {p['median']:.0f} ({p['min']:.0f}-{p['max']:.0f}); "
        f"ratio {ratio:.2f} (target >= {TARGET_RATIO:.0f}: "
        f"{met[res['targets']['lone_ratio_at_least_2']]})"
        + (
            f"; quick worker --dequeue-max {args.dequeue_max} {rates[tuned]['median']:.0f}"
            if args.dequeue_max
            else ""
        ),
        f"(b) noisy neighbour, small tenants' p99: quick {pq['median']:.1f} ms "
        f"({pq['min']:.1f}-{pq['max']:.1f}), procrastinate {pp['median']:.1f} ms "
        f"({pp['min']:.1f}-{pp['max']:.1f}) (target <= {TARGET_P99_MS:.0f} ms: "
        f"{met[res['targets']['small_p99_at_most_50_ms']]})",
        f"(c) enqueue_on in an application transaction adds {added['median']:.3f} ms "
        f"({added['min']:.3f}-{added['max']:.3f}; paired "
        f"{res['enqueue_in_transaction']['paired_added_p50_ms']['median']:.3f} ms) to "
        f"{res['enqueue_in_transaction']['without_p50_ms']['median']:.3f} ms "
        f"(target <= {TARGET_ADDED_MS:.0f} ms: {met[res['targets']['added_at_most_1_ms']]})",
        f"results in {out}",
    ]
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
