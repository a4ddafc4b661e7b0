"""Application transactions that enqueue on PostgreSQL (issue 42): ``Quick.enqueue_on``
against a plain ``INSERT`` into a jobs table, under concurrency.

``python -m bench.pg_app_txn [--seconds 3] [--threads 8] [--work-ms 50,0] [--runs 1]
[--no-procrastinate] [--zones kv|sql] [--dsn URL] [--json FILE]``; the full measurement is
``--seconds 20 --runs 3``.

One PostgreSQL cluster (:func:`bench.servers.postgres_server`, fsync on; or the server
``--dsn`` names, whose schemas the run drops again) holds everything. Per run, for each W
of ``--work-ms``, the two variants of one application transaction (their order alternating
run by run so a noisy stretch of the shared host falls on both):

1. ``--threads`` threads, each on its own psycopg connection, loop for ``--seconds``:
   BEGIN; INSERT a row into the application's ``orders``; enqueue one job; W ms of "other
   work" (``time.sleep``: the application's own calls, its HTTP request...); COMMIT.

   * **quick**: the job is ``q.enqueue_on(conn, ...)`` into one of 1,000 tenants at random
     (app ``a``). Today every quick commit takes one row lock (``quick_meta``, the
     resolver), and ``enqueue_on`` holds it until the application's COMMIT, so these
     transactions run one at a time for their whole W.
   * **baseline**: ``INSERT INTO jobs (queue, payload) VALUES (...)``, what Oban, River and
     procrastinate do inside the application's transaction (their trigger's NOTIFY aside).

   Transactions/s (those committed, over the time from the threads' common start to the
   last commit), each transaction's latency (BEGIN to COMMIT's return) p50/p99, and the
   ratio quick/baseline.

2. During the quick variant a real ``quick worker`` process with its defaults (no option but
   the app module, :mod:`bench.user_app`) consumes, a no-op handler recording its start
   (:func:`bench.common.record_start`). Pickup: the ``enqueue_on`` call's time (stamped in
   the payload) to the handler's start, p50/p99 over every committed item; beside it the
   same from the COMMIT's return (what the consumer could see).

3. One producer, ``q.enqueue(...)`` per job (autocommit), for ``--seconds``: jobs/s; beside
   it procrastinate's ``defer`` per job on the same server (the peer of
   :mod:`bench.postgres_peer`), unless ``--no-procrastinate``.

Medians over ``--runs``. The figures are wall-clock on whatever host runs it: the load
average is recorded around every case. Results on stdout; ``--json FILE`` writes them (a run
the docs cite goes to ``bench/results/``, see its README).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import REPO, child_env, latency_summary, log, machine, read_records
from bench.quickrun import JOB, open_quick

TENANTS = 1000
VARIANTS = ("quick", "baseline")
WARM_TENANT = "warm"  # the item that shows the worker is up; not counted


def _url(dsn: str, schema: str, zones: str = "kv") -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}" + (
        f"&zones={zones}" if zones != "kv" else ""
    )


def _loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def _create_app_tables(dsn: str, schema: str) -> None:
    """The application's tables, in their own schema (quick's schema holds only quick's)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".orders (id bigserial PRIMARY KEY,'
            " tenant text NOT NULL, total_cents int NOT NULL,"
            " created_at timestamptz NOT NULL DEFAULT now())"
        )
        # A job queue's table as Oban/River/procrastinate keep one: the row is the job.
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".jobs (id bigserial PRIMARY KEY,'
            " queue text NOT NULL, payload jsonb NOT NULL,"
            " state text NOT NULL DEFAULT 'available',"
            " scheduled_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(f'CREATE INDEX IF NOT EXISTS jobs_fetch ON "{schema}".jobs (queue, state, id)')


def _drop_schemas(dsn: str, schemas: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --- 1. the application's transactions ---------------------------------------------------


def transactions(
    dsn: str,
    variant: str,
    *,
    threads: int,
    seconds: float,
    work_ms: float,
    app_schema: str,
    q: Any = None,
    seed: int = 0,
) -> dict[str, Any]:
    """``threads`` threads each looping BEGIN; INSERT order; enqueue; W ms; COMMIT for
    ``seconds``. With ``variant`` "quick" the enqueue is ``q.enqueue_on``; the payload
    carries the call's time, and ``stamps`` maps it to the COMMIT's return."""
    import psycopg
    from psycopg.types.json import Jsonb

    insert_order = f'INSERT INTO "{app_schema}".orders (tenant, total_cents) VALUES (%s, %s)'
    insert_job = f'INSERT INTO "{app_schema}".jobs (queue, payload) VALUES (%s, %s)'
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(threads)]
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stamps: list[list[tuple[float, float]]] = [[] for _ in range(threads)]
    errors: list[str] = []
    ends = [0.0] * threads
    barrier = threading.Barrier(threads + 1)
    start = [0.0]

    def loop(k: int) -> None:
        conn, rng = conns[k], random.Random(seed * 1000 + k)
        barrier.wait()
        deadline = start[0] + seconds
        n = 0
        while time.perf_counter() < deadline:
            tenant = f"t{rng.randrange(TENANTS)}"
            n += 1
            t0 = time.perf_counter()
            called = 0.0
            try:
                with conn.transaction():
                    conn.execute(insert_order, (tenant, n))
                    called = time.time()
                    payload = {"t": tenant, "e": called, "d": called}
                    if variant == "quick":
                        q.enqueue_on(conn, JOB, payload, app="a", tenant=tenant)
                    else:
                        conn.execute(insert_job, ("default", Jsonb(payload)))
                    if work_ms:
                        time.sleep(work_ms / 1000)
            except Exception as e:  # counted and shown: the test asserts there are none
                errors.append(f"{type(e).__name__}: {e}")
                continue
            t1 = time.perf_counter()
            latencies[k].append((t1 - t0) * 1000)
            stamps[k].append((called, time.time()))
            ends[k] = t1

    workers = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads)]
    for t in workers:
        t.start()
    start[0] = time.perf_counter()
    barrier.wait()
    for t in workers:
        t.join()
    stopped = time.time()
    for conn in conns:
        conn.close()
    all_lat = [x for per in latencies for x in per]
    elapsed = max(max(ends) - start[0], 1e-9)
    return {
        "committed": len(all_lat),
        "errors": len(errors),
        "first_errors": errors[:3],
        "elapsed_s": round(elapsed, 3),
        "tx_s": len(all_lat) / elapsed,
        "latency_ms": latency_summary(all_lat),
        "stamps": [s for per in stamps for s in per],
        "stopped": stopped,
    }


# --- 2. the consumer: a real ``quick worker`` --------------------------------------------


@contextlib.contextmanager
def quick_worker(url: str, records: Path, logf: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``quick worker`` with its defaults on ``url``, handlers of :mod:`bench.user_app`;
    up once it has run one warm-up item (its import and first scan are not the pickup)."""
    records.write_bytes(b"")
    env = child_env(BENCH_OUT=str(records), QUICK_STORE=url)
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "bench.user_app:q"]
    with open(logf, "ab") as lf:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=lf, stderr=lf)
    try:
        q = open_quick(url)
        t = time.time()
        q.enqueue(JOB, {"t": WARM_TENANT, "e": t, "d": t}, app="a", tenant=WARM_TENANT)
        q.close()
        if not _wait(lambda: len(read_records(records)) >= 1, 120, proc):
            raise RuntimeError(f"quick worker ran no warm-up item (log: {logf})")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait(cond: Any, timeout_s: float, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return bool(cond())


def pickup(stamps: list[tuple[float, float]], records: Path, stopped: float) -> dict[str, Any]:
    """Each committed item's handler start against its ``enqueue_on`` call and its
    COMMIT's return; items are matched on the call's time as the payload carried it.
    ``after_producers``: how many started once the producers had stopped (a consumer
    that cannot keep up catches up then, so its pickup is bounded by the case's length)."""
    committed = {f"{called:.6f}": done for called, done in stamps}
    from_call: list[float] = []
    from_commit: list[float] = []
    after = 0
    for r in read_records(records):
        if r.tenant == WARM_TENANT:
            continue
        done = committed.get(f"{r.enq:.6f}")
        if done is None:
            continue
        from_call.append((r.start - r.enq) * 1000)
        from_commit.append((r.start - done) * 1000)
        after += r.start > stopped
    return {
        "started": len(from_call),
        "after_producers": after,
        "from_enqueue_ms": latency_summary(from_call),
        "from_commit_ms": latency_summary(from_commit),
    }


def quick_case(dsn: str, schema: str, work: Path, zones: str = "kv", **tx: Any) -> dict[str, Any]:
    """The quick variant with its consumer: a fresh store (in the ``zones`` layout),
    ``quick worker`` up first; after the producers stop, waits (60 s at most) for every
    committed item to start."""
    url = _url(dsn, schema, zones)
    records = work / f"{schema}.records"
    with quick_worker(url, records, work / f"{schema}.worker.log") as proc:
        q = open_quick(url)
        try:
            res = transactions(dsn, "quick", q=q, **tx)
        finally:
            q.close()
        want = res["committed"] + 1  # and the warm-up item
        _wait(lambda: len(read_records(records)) >= want, 60, proc)
    res["pickup"] = pickup(res["stamps"], records, res["stopped"])
    return res


# --- 3. one producer, autocommit -----------------------------------------------------------


def single_producer_quick(url: str, seconds: float, seed: int = 0) -> dict[str, Any]:
    q = open_quick(url)
    rng = random.Random(seed)
    lat: list[float] = []
    t_end = time.perf_counter() + seconds
    t_start = time.perf_counter()
    try:
        while time.perf_counter() < t_end:
            tenant = f"t{rng.randrange(TENANTS)}"
            t0 = time.perf_counter()
            q.enqueue(JOB, {"t": tenant, "e": time.time(), "d": 0.0}, app="a", tenant=tenant)
            lat.append((time.perf_counter() - t0) * 1000)
    finally:
        q.close()
    return _rate(lat, time.perf_counter() - t_start)


def single_producer_procrastinate(
    dsn: str, seconds: float, work: Path, seed: int = 0
) -> dict[str, Any]:
    """procrastinate's ``defer`` per job: the peer :mod:`bench.postgres_peer` runs."""
    from bench.postgres_peer import _procrastinate

    peer = _procrastinate(work, dsn, 1)
    rng = random.Random(seed)
    lat: list[float] = []
    try:
        peer.reset()
        t_end = time.perf_counter() + seconds
        t_start = time.perf_counter()
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            peer.enqueue(f"t{rng.randrange(TENANTS)}")
            lat.append((time.perf_counter() - t0) * 1000)
        elapsed = time.perf_counter() - t_start
        peer.reset()
    finally:
        peer.close()
    return _rate(lat, elapsed)


def _rate(lat: list[float], elapsed: float) -> dict[str, Any]:
    return {"jobs": len(lat), "jobs_s": len(lat) / elapsed, "latency_ms": latency_summary(lat)}


# --- the run -------------------------------------------------------------------------------


def one_run(dsn: str, prefix: str, r: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    app_schema = f"{prefix}_app"
    cases: dict[str, Any] = {}
    for w in args.work_ms:
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        case: dict[str, Any] = {}
        for variant in order:
            tx = dict(
                threads=args.threads,
                seconds=args.seconds,
                work_ms=w,
                app_schema=app_schema,
                seed=r,
            )
            load = _loadavg()
            if variant == "quick":
                res = quick_case(dsn, f"{prefix}_r{r}_w{_tag(w)}", work, args.zones, **tx)
            else:
                res = transactions(dsn, "baseline", **tx)
            res.pop("stamps")
            res["loadavg"] = [load, _loadavg()]
            case[variant] = res
            lat = res["latency_ms"]
            log(
                f"run {r + 1} W={w:g} ms {variant}: {res['tx_s']:.1f} tx/s, p50 "
                f"{lat['p50']:.1f} p99 {lat['p99']:.1f} ms, {res['errors']} errors"
                + (
                    f"; pickup p50 {res['pickup']['from_enqueue_ms']['p50']:.1f} p99 "
                    f"{res['pickup']['from_enqueue_ms']['p99']:.1f} ms "
                    f"({res['pickup']['started']}/{res['committed']} started, "
                    f"{res['pickup']['after_producers']} after the producers stopped)"
                    if variant == "quick"
                    else ""
                )
            )
        base = case["baseline"]["tx_s"]
        case["ratio_quick_to_baseline"] = case["quick"]["tx_s"] / base if base else float("nan")
        cases[f"w{_tag(w)}"] = case
    producer: dict[str, Any] = {}
    load = _loadavg()
    systems = ["quick", "procrastinate"] if args.procrastinate else ["quick"]
    for name in systems if r % 2 == 0 else systems[::-1]:  # alternating, as the cases
        if name == "quick":
            url = _url(dsn, f"{prefix}_r{r}_producer", args.zones)
            producer[name] = single_producer_quick(url, args.seconds, seed=r)
        else:
            producer[name] = single_producer_procrastinate(dsn, args.seconds, work, seed=r)
    producer["loadavg"] = [load, _loadavg()]
    log(
        f"run {r + 1} single producer: quick {producer['quick']['jobs_s']:.0f} jobs/s"
        + (
            f", procrastinate {producer['procrastinate']['jobs_s']:.0f} jobs/s"
            if args.procrastinate
            else ""
        )
    )
    return {"cases": cases, "single_producer": producer}


def _tag(w: float) -> str:
    return f"{w:g}".replace(".", "_")


def medians(runs: list[dict[str, Any]], work_ms: list[float]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    out: dict[str, Any] = {}
    for w in work_ms:
        cases = [run["cases"][f"w{_tag(w)}"] for run in runs]
        m: dict[str, float] = {}
        for variant in VARIANTS:
            m[f"{variant}_tx_s"] = med([c[variant]["tx_s"] for c in cases])
            for p in ("p50", "p99"):
                m[f"{variant}_{p}_ms"] = med([c[variant]["latency_ms"][p] for c in cases])
        m["ratio"] = med([c["ratio_quick_to_baseline"] for c in cases])
        for frm in ("from_enqueue_ms", "from_commit_ms"):
            for p in ("p50", "p99"):
                m[f"pickup_{frm[:-3]}_{p}_ms"] = med([c["quick"]["pickup"][frm][p] for c in cases])
        out[f"w{_tag(w)}"] = m
    producer = [run["single_producer"] for run in runs]
    out["single_producer"] = {
        name: med([p[name]["jobs_s"] for p in producer])
        for name in ("quick", "procrastinate")
        if name in producer[0]
    }
    return out


def table(m: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"{args.threads} threads, {args.seconds:g} s a case, medians of {args.runs} run(s),"
        f" zones={args.zones}",
        "",
        "| W ms | quick tx/s | baseline tx/s | quick/baseline | quick p50/p99 ms "
        "| baseline p50/p99 ms | pickup p50/p99 ms (from enqueue_on; from COMMIT) |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in args.work_ms:
        c = m[f"w{_tag(w)}"]
        lines.append(
            f"| {w:g} | {c['quick_tx_s']:.1f} | {c['baseline_tx_s']:.1f} | {c['ratio']:.3f} "
            f"| {c['quick_p50_ms']:.1f} / {c['quick_p99_ms']:.1f} "
            f"| {c['baseline_p50_ms']:.1f} / {c['baseline_p99_ms']:.1f} "
            f"| {c['pickup_from_enqueue_p50_ms']:.1f} / {c['pickup_from_enqueue_p99_ms']:.1f}; "
            f"{c['pickup_from_commit_p50_ms']:.1f} / {c['pickup_from_commit_p99_ms']:.1f} |"
        )
    sp = m["single_producer"]
    lines.append("")
    lines.append(
        f"single producer, one enqueue per job (autocommit): quick {sp['quick']:.0f} jobs/s"
        + (
            f", procrastinate defer {sp['procrastinate']:.0f} jobs/s"
            if "procrastinate" in sp
            else ""
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_app_txn", description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0, help="each case's length")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument(
        "--work-ms",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[50.0, 0.0],
        help="the transaction's other work W, ms, comma-separated (default 50,0)",
    )
    ap.add_argument("--runs", type=int, default=1, help="repetitions (medians reported)")
    ap.add_argument(
        "--no-procrastinate",
        dest="procrastinate",
        action="store_false",
        help="no procrastinate defer beside the single producer",
    )
    ap.add_argument(
        "--dsn",
        default="",
        help="a server to use (its schemas PREFIX_* are dropped after); default: a private one",
    )
    ap.add_argument("--prefix", default="pgapp", help="the schemas' names' prefix")
    ap.add_argument(
        "--zones",
        choices=("kv", "sql"),
        default="kv",
        help="quick's zone layout: kv (the default) or sql (postgresql://...?zones=sql)",
    )
    ap.add_argument("--json", default="", help="write the results to this file")
    args = ap.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else argv
    runs: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if args.dsn:
            dsn = args.dsn
            stack.callback(_drop_schemas, dsn, _schemas(args))
        else:
            from bench.servers import postgres_server

            dsn = stack.enter_context(postgres_server())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pgapp-")))
        _create_app_tables(dsn, f"{args.prefix}_app")
        for r in range(args.runs):
            runs.append(one_run(dsn, args.prefix, r, args, work))
    m = medians(runs, args.work_ms)
    doc = {
        "command": "python -m bench.pg_app_txn " + " ".join(argv_used),
        "machine": machine(),
        "setup": {
            "server": "one PostgreSQL cluster (initdb, fsync on)"
            if not args.dsn
            else "the server --dsn named",
            "transaction": "BEGIN; INSERT order; enqueue; sleep W ms; COMMIT",
            "quick": "Quick.enqueue_on(conn, ...), tenant among 1000 at random",
            "baseline": "INSERT INTO jobs (queue, payload) VALUES (...)",
            "consumer": "quick worker with its defaults (bench.user_app), during quick",
            "single_producer": "Quick.enqueue per job, autocommit"
            + ("; procrastinate Task.defer per job" if args.procrastinate else ""),
        },
        "threads": args.threads,
        "seconds": args.seconds,
        "work_ms": args.work_ms,
        "medians": m,
        "runs": runs,
    }
    print(table(m, args), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1))
        log(f"results in {args.json}")
    return 0


def _schemas(args: argparse.Namespace) -> list[str]:
    """Every schema a run with these options makes."""
    names = [f"{args.prefix}_app"]
    for r in range(args.runs):
        names += [f"{args.prefix}_r{r}_w{_tag(w)}" for w in args.work_ms]
        names.append(f"{args.prefix}_r{r}_producer")
    return names


if __name__ == "__main__":
    sys.exit(main())
