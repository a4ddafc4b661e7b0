"""How late delayed items start (issue 15 point 5, exact timers).

``python -m bench.delayed_lateness [--items 500] [--runs 3] [--tenants 20] [--out DIR]
[--visits three|one|both] [--lookahead 0,0.05]``

One ``quick worker --workers 4`` process on a fresh SQLite file (with ``--visits one`` or
``--lookahead``, a consumer process with those ConsumerConfig fields set from Python, as
``quick worker`` has no option for them); this process
enqueues ``--items`` items with delays uniform in [0.5, 4] s over ``--tenants`` tenants,
as a producer in another process would (so no local wake-up helps). Each handler records
when it started; lateness is that start minus the time the item was requested for: the
producer's ``time.time()`` just before its enqueue plus the delay, as a user (and the peer
benchmark's delayed workload) would measure it. It is read with the worker's own clock
(the one vesting is decided by) and with the host's wall clock. Negative lateness is an
item started early. (Until this change the reference was the stored enqueue time plus
the delay, each rounded down to the millisecond: up to about 1 ms before the requested
time, which made every item look up to 1 ms later than it was.)
Prints p50/p99/max per run and the median of each over the runs, and writes
``delayed_lateness.json`` under ``bench/results/<UTC timestamp>/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import run_folder
from quickzones.client import Quick

HANDLERS = """\
import json, os, time
from quickzones import Quick

quick = Quick.open(os.environ["LATENESS_STORE"])
OUT = open(os.environ["LATENESS_OUT"], "a", buffering=1)

@quick.job("delayed")
def delayed(payload, ctx):
    wall_ms = time.time() * 1000
    store_ms = quick.clock.now() * 1000  # the clock vesting times are read with
    due_ms = payload["due_ms"]  # requested: the producer's time.time() + delay
    OUT.write(json.dumps([ctx.item_id, store_ms - due_ms, due_ms, wall_ms - due_ms]) + "\\n")
"""


# The worker when a setting differs from quick worker's: the same Consumer.run_forever(),
# its ConsumerConfig from Python (argv[1], JSON), one line on stdout once it starts.
CONSUMER = """\
import json, sys
sys.path.insert(0, ".")
from quickzones.consumer import ConsumerConfig
from lateness_handlers import quick
config = ConsumerConfig(**json.loads(sys.argv[1]))
print(f"consumer {config}", flush=True)
quick.consumer(config).run_forever()
"""


def _worker_argv(visits: str, lookahead: str | None) -> list[str]:
    if visits == "three" and lookahead is None:
        quick = Path(sys.executable).with_name("quick")
        return [str(quick), "worker", "--app-module", "lateness_handlers", "--workers", "4"]
    config: dict[str, Any] = {"workers": 4, "one_transaction_visits": visits == "one"}
    if lookahead is not None:
        config["timer_lookahead_s"] = float(lookahead)
    return [sys.executable, "-c", CONSUMER, json.dumps(config)]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def one_run(
    items: int,
    tenants: int,
    seed: int,
    visits: str = "three",
    lookahead: str | None = None,
    delays_s: tuple[float, float] = (0.5, 4.0),
) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="quick-lateness-") as tmp:
        store = f"sqlite:///{tmp}/q.db"
        out = Path(tmp) / "started.jsonl"
        (Path(tmp) / "lateness_handlers.py").write_text(HANDLERS)
        q = Quick.open(store)  # creates the store before the worker opens it
        env = {**os.environ, "LATENESS_STORE": store, "LATENESS_OUT": str(out)}
        env.pop("QUICK_STORE", None)
        worker = subprocess.Popen(
            _worker_argv(visits, lookahead),
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert worker.stdout is not None
            worker.stdout.readline()  # started
            for i in range(items):
                delay = rng.uniform(*delays_s)
                requested_ms = (time.time() + delay) * 1000
                q.enqueue(
                    "delayed",
                    {"due_ms": requested_ms},
                    app="bench",
                    tenant=f"t{i % tenants}",
                    delay=delay,
                )
            produced_ms = time.time() * 1000  # the producer's last commit
            end = time.monotonic() + 60
            while time.monotonic() < end:
                done = out.read_text().count("\n") if out.exists() else 0
                if done >= items:
                    break
                time.sleep(0.05)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
            q.close()
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    lateness = [float(late) for _, late, _, _ in rows]
    wall = [float(late) for _, _, _, late in rows]
    # Items due once the producer stopped writing: lateness without its commits competing.
    quiet = [float(late) for _, late, due, _ in rows if due > produced_ms] or [0.0]
    return {
        "items": items,
        "started": len(rows),
        "distinct": len({item_id for item_id, _, _, _ in rows}),
        "early": sum(1 for late in lateness if late < 0),
        "p50_ms": _percentile(lateness, 0.50),
        "p99_ms": _percentile(lateness, 0.99),
        "max_ms": max(lateness),
        "min_ms": min(lateness),
        # The same against this host's wall clock: the store's steady clock may run a
        # little ahead of it (quickzones.store.steady_clock), never behind.
        "early_wall": sum(1 for late in wall if late < 0),
        "wall_p50_ms": _percentile(wall, 0.50),
        "wall_p99_ms": _percentile(wall, 0.99),
        "quiet_items": len(quiet),
        "quiet_p99_ms": _percentile(quiet, 0.99),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.delayed_lateness")
    ap.add_argument("--items", type=int, default=500)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--label", default="", help="a note kept with the results")
    ap.add_argument("--out", default=None, help="results folder (default bench/results/<ts>)")
    ap.add_argument(
        "--lookahead",
        default=None,
        help="comma-separated timer_lookahead_s values (seconds) to run side by side, "
        "e.g. 0,0.05 (default: the worker's default only)",
    )
    ap.add_argument(
        "--visits",
        choices=("three", "one", "both"),
        default="three",
        help="the worker's visits: the paper's three transactions, one, or both side by "
        "side (each run alternates which goes first)",
    )
    args = ap.parse_args(argv)
    visits = ["three", "one"] if args.visits == "both" else [args.visits]
    lookaheads: list[str | None] = (
        [v.strip() for v in args.lookahead.split(",")] if args.lookahead else [None]
    )
    # A mode: "<visits>" or "<visits>/lookahead=<s>".
    runs_of = {
        (v if la is None else f"{v}/lookahead={la}"): (v, la) for v in visits for la in lookaheads
    }
    modes = list(runs_of)
    by_mode: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for n in range(args.runs):
        for mode in modes if n % 2 == 0 else modes[::-1]:
            v, la = runs_of[mode]
            result = one_run(args.items, args.tenants, seed=n, visits=v, lookahead=la)
            by_mode[mode].append(result)
            print(
                f"run {n + 1} ({mode}): started "
                f"{result['started']}/{result['items']}, early "
                f"{result['early']}, lateness p50 {result['p50_ms']:.2f} ms, p99 "
                f"{result['p99_ms']:.2f} ms, max {result['max_ms']:.2f} ms; p99 of the "
                f"{result['quiet_items']} due after the producer's last commit "
                f"{result['quiet_p99_ms']:.2f} ms; by the wall clock p50 "
                f"{result['wall_p50_ms']:.2f} ms, p99 {result['wall_p99_ms']:.2f} ms, early "
                f"{result['early_wall']}",
                flush=True,
            )
    summaries = {}
    for mode, runs in by_mode.items():
        summaries[mode] = {
            key: statistics.median(r[key] for r in runs)
            for key in (
                "p50_ms",
                "p99_ms",
                "max_ms",
                "early",
                "quiet_p99_ms",
                "wall_p99_ms",
                "early_wall",
            )
        }
        summary = summaries[mode]
        print(
            f"{mode}, median of {len(runs)}: p50 {summary['p50_ms']:.2f} "
            f"ms, p99 {summary['p99_ms']:.2f} ms, max {summary['max_ms']:.2f} ms, early "
            f"{summary['early']}"
        )
    folder = run_folder("lateness", args.out)
    document = {
        "command": "python -m bench.delayed_lateness " + " ".join(sys.argv[1:]),
        "label": args.label,
        "runs": by_mode[modes[0]],
        "median": summaries[modes[0]],
        "by_visits": {mode: {"runs": by_mode[mode], "median": summaries[mode]} for mode in modes},
    }
    (folder / "delayed_lateness.json").write_text(json.dumps(document, indent=2) + "\n")
    print(f"results: {folder / 'delayed_lateness.json'}")
    return 0 if all(r["started"] == r["items"] for rs in by_mode.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
