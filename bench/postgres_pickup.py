"""Where a pickup's time goes on PostgreSQL (issue 30 (b)): another process enqueues one
item at a time into 100 tenants' zones while a consumer with ``ConsumerConfig(workers=4)``
(the defaults ``quick worker --workers 4`` gets) waits; each item's handler records when it
started.

``python -m bench.postgres_pickup [--items 400] [--rounds 3] [--zones kv|sql] [--out DIR]``

``python -m bench.postgres_pickup --light-load [--rate 200] [--seconds 10] [--workers 4]
[--rounds 3]``: issue 42's light-load target (p50 at most 10 ms, p99 at most 40 ms) with
procrastinate beside quick on the same server, the two alternating round by round: one
worker process (``quick worker --workers N`` with its defaults against ``procrastinate
worker --concurrency N``, LISTEN/NOTIFY on), this process offering ``--rate`` no-op jobs a
second on a fixed schedule (into 100 tenants in turn), one call a job, for ``--seconds``;
each job's pickup from just before its enqueue call to its start (the peers' own
records, :func:`bench.common.record_start`). Medians over rounds of each round's p50/p99.

Per item, from the producer's clock and the consumer's ``pointer_leased`` events (one
machine, one clock): the enqueue's own time (both parts), from the enqueue's return to the
visit that leased the zone's pointer (the commit's detection, the scan, the visit), from
that visit to the handler's start, and the whole pickup (the enqueue's call to the start:
what ``bench.postgres_peer`` measures). Medians over rounds of each round's p50/p90/p99.
Results: ``bench/results/<UTC timestamp>-postgres-pickup/postgres_pickup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import REPO, log, machine, run_folder, summary
from bench.servers import postgres_server

# The producer: one enqueue every ~5 ms into 100 tenants, each timed; written as JSON.
PRODUCER = r"""
import json, sys, time
from quickzones.client import Quick
q = Quick.open(sys.argv[1])
out = []
for i in range(int(sys.argv[2])):
    t = time.time()
    q.enqueue("j", {"i": i}, app="b", tenant=f"t{i % 100}")
    out.append((i, t, time.time()))
    time.sleep(0.005)
q.close()
json.dump(out, open(sys.argv[3], "w"))
"""
STAGES = ("enqueue", "enqueued_to_leased", "leased_to_start", "pickup")


def _percentiles(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {
        p: v[min(len(v) - 1, int(len(v) * q))]
        for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }


def one_round(
    dsn: str, schema: str, items: int, work: Path, zones: str = "kv"
) -> dict[str, dict[str, float]]:
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig

    url = f"{dsn}?schema={schema}" + (f"&zones={zones}" if zones != "kv" else "")
    q = Quick.open(url)
    started: dict[int, float] = {}
    leased: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()

    def observe(event: str, fields: dict[str, Any]) -> None:
        if event == "pointer_leased":
            with lock:
                leased[fields["zone"].tenant].append(time.time())

    q.job("j")(lambda payload, ctx: started.__setitem__(payload["i"], time.time()))
    consumer = q.consumer(ConsumerConfig(workers=4), observer=observe)
    consumer.start()
    try:
        time.sleep(1.0)
        enqueued = work / f"{schema}.json"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-c", PRODUCER, url, str(items), str(enqueued)],
                       check=True, env=env)  # fmt: skip
        deadline = time.monotonic() + 30
        while len(started) < items and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        consumer.stop(5)
        q.close()
    stages: dict[str, list[float]] = defaultdict(list)
    for i, called, returned in json.loads(enqueued.read_text()):
        if i not in started:
            raise RuntimeError(f"item {i} never started")
        stages["enqueue"].append((returned - called) * 1000)
        stages["pickup"].append((started[i] - called) * 1000)
        visit = next((t for t in leased[f"t{i % 100}"] if t >= returned), None)
        if visit is not None:
            stages["enqueued_to_leased"].append((visit - returned) * 1000)
            stages["leased_to_start"].append((started[i] - visit) * 1000)
    return {name: _percentiles(stages[name]) for name in STAGES}


def light_load_round(peer: Any, rate: float, seconds: float) -> dict[str, float]:
    """One worker of ``peer`` running, ``rate`` jobs a second offered for ``seconds`` on a
    fixed schedule (a late enqueue does not push the later ones back); the pickups' p50
    and p99 in ms and the rate achieved."""
    from bench.common import read_records, wait_for_lines

    n = int(rate * seconds)
    peer.reset()
    peer.start_worker()
    try:
        peer.wait_ready()
        time.sleep(1.0)  # idle, as a worker between bursts is
        began = time.time()
        for i in range(n):
            pause = began + i / rate - time.time()
            if pause > 0:
                time.sleep(pause)
            peer.enqueue(f"t{i % 100}")
        enqueued = n / (time.time() - began)  # what the producer reached
        wait_for_lines(peer.out, n + 1, 60.0)
    finally:
        peer.stop_worker()
    pickups = [(r.start - r.enq) * 1000 for r in read_records(peer.out) if r.tenant != "warmup"]
    if len(pickups) < n:
        raise RuntimeError(f"{peer.name}: {len(pickups)} of {n} jobs started")
    got = _percentiles(pickups)
    return {"p50": got["p50"], "p99": got["p99"], "enqueued_per_s": enqueued}


def light_load(args: argparse.Namespace) -> int:
    from bench.postgres_peer import PostgresQuickPeer, _procrastinate

    rounds: list[dict[str, dict[str, float]]] = []
    with postgres_server() as dsn, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("quick", "procrastinate") if r % 2 == 0 else ("procrastinate", "quick")
            one: dict[str, dict[str, float]] = {}
            for system in order:
                work = Path(tmp) / f"{system}-{r}"
                work.mkdir()
                if system == "quick":
                    peer = PostgresQuickPeer(
                        work, dsn, f"light_{r}", args.workers, zones=args.zones
                    )
                else:
                    peer = _procrastinate(work, dsn, args.workers)
                try:
                    one[system] = light_load_round(peer, args.rate, args.seconds)
                finally:
                    peer.close()
                log(f"round {r + 1}/{args.rounds} {system}: {one[system]}")
            rounds.append(one)
    systems = ("quick", "procrastinate")
    medians = {
        s: {k: summary([r[s][k] for r in rounds])["median"] for k in rounds[0][s]} for s in systems
    }
    print(f"| system (pickup at {args.rate:g} jobs/s offered) | p50 ms | p99 ms | enqueued/s |")
    print("|---|---|---|---|")
    for s in systems:
        m = medians[s]
        print(f"| {s} | {m['p50']:.1f} | {m['p99']:.1f} | {m['enqueued_per_s']:.0f} |")
    out = run_folder("postgres-light-load", args.out)
    doc = {"machine": machine(), "argv": sys.argv, "rounds": rounds, "medians": medians}
    (out / "postgres_light_load.json").write_text(json.dumps(doc, indent=2))
    log(f"results in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.postgres_pickup", description=__doc__)
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="", help="results directory")
    ap.add_argument(
        "--light-load", action="store_true", help="issue 42's light load, procrastinate beside"
    )
    ap.add_argument("--rate", type=float, default=200.0, help="jobs a second offered")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long they are offered")
    ap.add_argument("--workers", type=int, default=4, help="quick's --workers, procrastinate's -c")
    ap.add_argument(
        "--zones", choices=("kv", "sql"), default="kv", help="quick's zone layout (kv or sql)"
    )
    args = ap.parse_args(argv)
    if args.light_load:
        return light_load(args)
    rounds: list[dict[str, dict[str, float]]] = []
    with postgres_server() as dsn, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            one = one_round(dsn, f"pickup_{os.getpid()}_{r}", args.items, Path(tmp), args.zones)
            rounds.append(one)
            log(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(
                    f"{s} p50 {one[s]['p50']:.2f} p99 {one[s]['p99']:.2f} ms" for s in STAGES
                )
            )
    medians = {
        s: {p: summary([r[s][p] for r in rounds])["median"] for p in ("p50", "p90", "p99")}
        for s in STAGES
    }
    print("| stage | p50 | p90 | p99 |\n|---|---|---|---|")
    for s in STAGES:
        m = medians[s]
        print(f"| {s} | {m['p50']:.2f} | {m['p90']:.2f} | {m['p99']:.2f} |")
    out = run_folder("postgres-pickup", args.out)
    doc = {"machine": machine(), "argv": sys.argv, "rounds": rounds, "medians": medians}
    (out / "postgres_pickup.json").write_text(json.dumps(doc, indent=2))
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
