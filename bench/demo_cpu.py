"""The CPU a consumer spends per item on ``quick demo``'s shape, apart from the host's
load (issue 40 point 9).

``python -m bench.demo_cpu [--runs 5] [--baseline PYTHON] [--out DIR]``

A small tenant's pickup in the demo waits, under the GIL, behind the visits of the noisy
tenant (``bench.demo_pickup``), so what the consumer's Python does per item is paid in
every small tenant's tail; on a shared host the demo's own figures follow the load more
than the code (``bench.demo``). This bench measures that work alone: a fresh SQLite store
with the demo's tenants (20 small ones of 100 items each, a noisy one of 2,000), drained
by the demo's consumer configuration with ``run_until_idle`` on one thread (the scans,
the visits, the start checks, the handlers, the completions; no waits), and reports the
process CPU time per item (``time.process_time``, which other processes on the host do
not add to). ``--baseline`` names another checkout's interpreter (its own virtualenv):
each run of that tree follows one of this tree, in turns, and the child is this file run
by that interpreter, so it uses only the public API both trees have.

Results: ``bench/results/<UTC timestamp>-demo-cpu/demo_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

SMALL, SMALL_ITEMS, NOISY_ITEMS = 20, 100, 2000


def drain() -> dict[str, Any]:
    """One run in this process: the store filled, then drained on this thread."""
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig

    with tempfile.TemporaryDirectory(prefix="quick-demo-cpu-") as folder:
        q = Quick.open(f"sqlite:///{os.path.join(folder, 'demo.db')}")
        try:
            q.job("demo.work")(lambda payload, ctx: None)
            for t in range(SMALL):
                q.enqueue_many(
                    "demo.work",
                    [{"n": i} for i in range(SMALL_ITEMS)],
                    app="demo",
                    tenant=f"tenant-{t:02d}",
                )
            q.enqueue_many(
                "demo.work", [{"n": i} for i in range(NOISY_ITEMS)], app="demo", tenant="noisy"
            )
            consumer = q.consumer(  # the demo's (quick_core/cli/demo.py)
                ConsumerConfig(
                    workers=8,
                    managers=4,
                    dequeue_max=4,
                    selection_max=8,
                    pointer_lease_s=1.0,
                    idle_sleep_s=0.005,
                    min_inactive_s=2.0,
                    seed=1,
                )
            )
            started = time.process_time()
            items = consumer.run_until_idle()
            cpu_s = time.process_time() - started
            visits = int(consumer.stats["visited"])
        finally:
            q.close()
    return {"items": items, "visits": visits, "cpu_us_per_item": cpu_s / max(items, 1) * 1e6}


def child(python: str) -> dict[str, Any]:
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--child"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.demo_cpu", description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", default="", help="another tree's python (its virtualenv)")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(drain()))
        return 0
    from bench.common import log, summary, write_run

    trees = {"this": sys.executable, **({"baseline": args.baseline} if args.baseline else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for i in range(args.runs):
        # Alternate which tree goes first, so a busy stretch falls on both.
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            r = {**child(trees[name]), "load_before": os.getloadavg()[0]}
            runs[name].append(r)
            log(
                f"run {i + 1}/{args.runs} {name}: {r['items']} items, {r['visits']} visits, "
                f"{r['cpu_us_per_item']:.0f} CPU us/item (load {r['load_before']:.1f})"
            )
    medians = {
        name: summary([r["cpu_us_per_item"] for r in rs])["median"] for name, rs in runs.items()
    }
    out = write_run(
        "demo-cpu",
        args.out,
        "python -m bench.demo_cpu " + " ".join(argv or sys.argv[1:]),
        {"runs": runs, "median_cpu_us_per_item": medians},
    )
    log(f"median CPU us/item: {medians}; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
