"""Where a ``quick demo`` small tenant's pickup goes: from its enqueue to the visit that
dequeued it (the scanner and a manager: Algorithms 1-2), then from that dequeue to its
worker's start (the hand-off to the workers' pool: Algorithm 3), from the consumer's own
``dequeued`` and ``started`` events (issue 40 point 9).

``python -m bench.demo_pickup [--runs 3] [--seconds 20] [--out DIR]``

Each run is the demo with its defaults, in this process, the consumer's observer noting
each small tenant's item as its visit dequeues it and as its worker starts it (the
demo's handler starts just after). The two parts say which side to cut: a long first
part is the scanner's and managers' (visits, their commits, the GIL they wait for), a long
second part is the workers' hand-off. The host's load average is noted before each run:
on a busy host both parts grow whatever the code (``bench.demo``).

Results: ``bench/results/<UTC timestamp>-demo-pickup/demo_pickup.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
from typing import Any

from rich.console import Console

from bench.common import latency_summary, log, machine, run_folder, summary
from quickzones.cli.demo import NOISY, DemoConfig, run_demo
from quickzones.cpu_placement import CpuPlacement, parse_cpus


class PickupSplit:
    """The consumer's observer: each small tenant's item's enqueue, dequeue and start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dequeued: dict[str, tuple[float, float]] = {}  # item -> (enqueued, dequeued) ms
        self.started: dict[str, float] = {}  # item -> ms

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        if event not in ("dequeued", "started") or fields["zone"].tenant == NOISY:
            return
        now = time.time() * 1000
        with self._lock:
            if event == "dequeued":
                self.dequeued[fields["item_id"]] = (float(fields["enqueued_ms"]), now)
            else:
                self.started.setdefault(fields["item_id"], now)

    def parts(self) -> dict[str, list[float]]:
        """Per item that started: enqueue -> dequeued, dequeued -> started, and the sum."""
        with self._lock:
            both = [(*self.dequeued[i], s) for i, s in self.started.items() if i in self.dequeued]
        return {
            "enqueue_to_dequeued": [d - e for e, d, _ in both],
            "dequeued_to_started": [s - d for _, d, s in both],
            "enqueue_to_started": [s - e for e, _, s in both],
        }


def one_run(cfg: DemoConfig) -> dict[str, Any]:
    split = PickupSplit()
    load = os.getloadavg()[0]
    ok = run_demo(cfg, Console(file=io.StringIO(), width=240), split)
    parts = split.parts()
    return {
        "load_before": load,
        "all_run": ok,
        **{name: latency_summary(values) for name, values in parts.items()},
    }


def _logged_run(i: int, runs: int, seconds: float) -> dict[str, Any]:
    r = one_run(DemoConfig(duration_s=seconds))
    log(
        f"run {i + 1}/{runs}: "
        + ", ".join(
            f"{name} p50 {r[name]['p50']:.1f} p99 {r[name]['p99']:.1f} ms"
            for name in ("enqueue_to_dequeued", "dequeued_to_started", "enqueue_to_started")
        )
        + f" ({r['enqueue_to_started']['n']} small items, load {r['load_before']:.1f})"
    )
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.demo_pickup", description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    runs = []
    # Placed as quick demo places itself (QUICK_CPUS, default auto: cpu_placement).
    placement = CpuPlacement(parse_cpus(os.environ.get("QUICK_CPUS", "auto")))
    placement.start()
    try:
        for i in range(args.runs):
            runs.append(_logged_run(i, args.runs, args.seconds))
    finally:
        placement.stop()
    res = {
        "command": "python -m bench.demo_pickup " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "runs": runs,
        "medians": {
            name: {q: summary([r[name][q] for r in runs])["median"] for q in ("p50", "p99")}
            for name in ("enqueue_to_dequeued", "dequeued_to_started", "enqueue_to_started")
        },
    }
    out = run_folder("demo-pickup", args.out)
    (out / "demo_pickup.json").write_text(json.dumps(res, indent=1))
    log(f"medians of {args.runs}: {res['medians']}; results in {out}")
    return 0 if all(r["all_run"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
