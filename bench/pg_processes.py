"""``quick worker --processes 2`` against one process on PostgreSQL (issue 42's last
target): items/s, and what an item costs the server: its CPU, its commits, and the round
trips the worker makes.

``python -m bench.pg_processes [--items 5000] [--tenants 100] [--runs 3] [--zones sql|kv]
[--out DIR]``

On a private PostgreSQL server (:func:`bench.servers.postgres_server`, fsync on), per run
and for P = 1 and 2 (their order alternating run by run): a fresh schema; one producer
enqueues ``--items`` no-op jobs, one ``enqueue`` call each, into ``--tenants`` tenants in
turn, no worker running; then ``quick worker --workers 4 --processes P`` (every other
setting at its default, :mod:`bench.user_app`) is spawned and timed from its spawn to the
last job's end. Over that drain: the server's CPU seconds (user and system of every process
named ``postgres``: the bench's own server is the only one it expects), its commits and
rollbacks (``pg_stat_database``), each per item. The last run drains once more for each P
through a proxy in front of the server that counts the worker's round trips (each
extended-query ``Sync`` and simple ``Query``, :mod:`tests.pg_round_trips`); the proxy slows
each round trip, so that drain's rate is not reported. Prints a table; results in
``bench/results/<UTC timestamp>-pg-processes/pg_processes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench.common import (
    child_env,
    cpu_seconds,
    log,
    machine,
    read_ends,
    run_folder,
    stop_process,
    wait_for_lines,
)
from bench.quickrun import JOB, open_quick, user_worker_cmd
from bench.servers import postgres_server

WORKERS = 4


def server_cpu_s() -> float:
    """User and system CPU seconds of every process named ``postgres`` so far."""
    return cpu_seconds(p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres")


def transactions(dsn: str) -> int:
    """The server's commits and rollbacks so far, every database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT sum(xact_commit + xact_rollback)::bigint FROM pg_stat_database"
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def drain(
    dsn: str, url: str, processes: int, items: int, tenants: int, folder: Path
) -> dict[str, Any]:
    """Enqueue ``items`` one call each, then time ``quick worker --processes`` draining
    them, with the server's CPU and transactions over the drain."""
    q = open_quick(url)
    try:
        t0 = time.perf_counter()
        for n in range(items):
            tenant = f"t{n % tenants}"
            q.enqueue(JOB, {"t": tenant, "e": time.time(), "d": 0.0}, app="b", tenant=tenant)
        enqueue_per_s = items / (time.perf_counter() - t0)
    finally:
        q.close()
    out, ends = folder / f"starts-{processes}.txt", folder / f"ends-{processes}.txt"
    for path in (out, ends):
        path.unlink(missing_ok=True)
    env = child_env(QUICK_STORE=url, BENCH_OUT=str(out), BENCH_END_OUT=str(ends))
    time.sleep(1.0)  # the producer's part twos and the server's stats settle
    cpu0, tx0 = server_cpu_s(), transactions(dsn)
    spawn = time.time()
    cmd = [*user_worker_cmd(WORKERS), "--processes", str(processes)]
    worker = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_lines(ends, items, 300)
        finished = read_ends(ends)
        cpu1 = server_cpu_s()  # before the worker's sessions end and take their CPU along
    finally:
        stop_process(worker, 30)
    # A session reports its transactions to the statistics about once a second, and when
    # it ends: counted once the worker's sessions have ended (its stop adds a few).
    time.sleep(1.5)
    tx1 = transactions(dsn)
    if len(finished) < items:
        raise RuntimeError(f"{len(finished)} of {items} items ended in 300 s")
    seconds = max(finished) - spawn
    return {
        "processes": processes,
        "enqueue_per_s": enqueue_per_s,
        "items_per_s": items / seconds,
        "server_cpu_ms_per_item": (cpu1 - cpu0) * 1000 / items,
        # Less the two reads of the counter itself.
        "transactions_per_item": (tx1 - tx0 - 2) / items,
    }


def round_trips(
    dsn: str, url: str, processes: int, items: int, tenants: int, folder: Path
) -> float:
    """The worker's round trips an item, its connections through a counting proxy."""
    from urllib.parse import urlsplit

    from tests.pg_round_trips import RoundTripCounter

    port = urlsplit(url).port
    assert port is not None
    counter = RoundTripCounter(port)
    try:
        proxied = url.replace(f":{port}/", f":{counter.port}/")
        q = open_quick(url)
        try:
            for n in range(items):
                tenant = f"t{n % tenants}"
                q.enqueue(JOB, {"t": tenant, "e": time.time(), "d": 0.0}, app="b", tenant=tenant)
        finally:
            q.close()
        ends = folder / f"trips-{processes}.txt"
        ends.unlink(missing_ok=True)
        env = child_env(QUICK_STORE=proxied, BENCH_OUT=os.devnull, BENCH_END_OUT=str(ends))
        counter.reset()
        cmd = [*user_worker_cmd(WORKERS), "--processes", str(processes)]
        worker = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for_lines(ends, items, 300)
            trips = counter.reset()
        finally:
            stop_process(worker, 30)
        return trips / items
    finally:
        counter.close()


def store_url(dsn: str, schema: str, zones: str) -> str:
    return f"{dsn}?schema={schema}" + ("&zones=sql" if zones == "sql" else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--zones", choices=("sql", "kv"), default="sql")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = run_folder("pg-processes", str(args.out) if args.out else None)
    scratch = Path(tempfile.mkdtemp(prefix="bench-pg-processes-"))
    results: list[dict[str, Any]] = []
    trips: dict[int, float] = {}
    with postgres_server() as dsn:
        for run in range(args.runs):
            for processes in (1, 2) if run % 2 == 0 else (2, 1):
                url = store_url(dsn, f"p{run}_{processes}", args.zones)
                got = drain(dsn, url, processes, args.items, args.tenants, scratch)
                got["run"] = run
                results.append(got)
                log(
                    f"run {run} --processes {processes}: {got['items_per_s']:.0f} items/s,"
                    f" server CPU {got['server_cpu_ms_per_item']:.3f} ms an item,"
                    f" {got['transactions_per_item']:.2f} transactions an item"
                )
        for processes in (1, 2):
            url = store_url(dsn, f"trips_{processes}", args.zones)
            trips[processes] = round_trips(dsn, url, processes, args.items, args.tenants, scratch)
            log(f"--processes {processes}: {trips[processes]:.2f} round trips an item")
    rows = []
    for processes in (1, 2):
        mine = [r for r in results if r["processes"] == processes]
        rows.append(
            {
                "processes": processes,
                "items_per_s": statistics.median(r["items_per_s"] for r in mine),
                "server_cpu_ms_per_item": statistics.median(
                    r["server_cpu_ms_per_item"] for r in mine
                ),
                "transactions_per_item": statistics.median(
                    r["transactions_per_item"] for r in mine
                ),
                "round_trips_per_item": trips[processes],
            }
        )
    print(f"zones={args.zones}, {args.items} items, {args.tenants} tenants, medians of {args.runs}")
    print("| --processes | items/s | server CPU an item | transactions an item |", end="")
    print(" round trips an item |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['processes']} | {row['items_per_s']:,.0f} |"
            f" {row['server_cpu_ms_per_item']:.3f} ms | {row['transactions_per_item']:.2f} |"
            f" {row['round_trips_per_item']:.2f} |"
        )
    (folder / "pg_processes.json").write_text(
        json.dumps(
            {"machine": machine(), "options": vars(args) | {"out": str(folder)},
             "runs": results, "medians": rows},
            indent=1,
        )
    )  # fmt: skip
    log(f"results in {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
