"""Tenant weights 3 and 1, unbounded backlogs, one consumer (issue 31's target: starts in
the ratio 3:1 within 10 % over a minute).

``python -m bench.weights [--seconds 60] [--workers 4] [--work-ms 2] [--store URL]``

One ``quick worker --workers N`` process (:mod:`bench.user_app`, every other setting at its
default) runs the :data:`bench.quickrun.JOB` items of tenants ``gold`` (weight 3, set with
``quick weight set``) and ``basic`` (no weight: 1). This process keeps both backlogs at
least ``--keep`` items deep for the whole run, so neither ever runs dry. The ratio counts
the starts each tenant's jobs recorded (:func:`bench.common.record_start`) after the
first 5 s (the worker's start-up), to the end. Results:
``bench/results/<UTC timestamp>-weights/weights.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.common import (
    child_env,
    log,
    machine,
    read_records,
    run_folder,
    store_run_parser,
    store_url,
)
from bench.quickrun import JOB, user_worker_cmd
from quickzones.client import Quick

WARM_UP_S = 5.0
WEIGHTS = {"gold": 3.0, "basic": 1.0}


def _top_up(q: Quick, enqueued: dict[str, int], started: dict[str, int], keep: int,
            work_ms: float) -> None:  # fmt: skip
    for tenant in WEIGHTS:
        short = keep - (enqueued[tenant] - started[tenant])
        if short > 0:
            now = time.time()
            payload = {"t": tenant, "e": now, "d": now, "w": work_ms}
            q.enqueue_many(JOB, [payload] * short, app="bench", tenant=tenant)
            enqueued[tenant] += short


def main() -> None:
    ap = store_run_parser(__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--work-ms", type=float, default=2.0, help="each job sleeps this long")
    ap.add_argument("--keep", type=int, default=3000, help="items kept queued per tenant")
    args = ap.parse_args()
    folder = run_folder("weights", args.out)
    out = folder / "starts.txt"
    url = store_url(args.store, "weights.db")
    q = Quick.open(url)
    q.set_weight("bench", "gold", WEIGHTS["gold"])
    enqueued = dict.fromkeys(WEIGHTS, 0)
    _top_up(q, enqueued, dict.fromkeys(WEIGHTS, 0), args.keep, args.work_ms)
    env = child_env(BENCH_OUT=str(out), QUICK_STORE=url)
    worker = subprocess.Popen(user_worker_cmd(args.workers), env=env)
    began = time.time()
    try:
        while time.time() - began < args.seconds + WARM_UP_S:
            time.sleep(0.5)
            records = read_records(out)
            started = {t: sum(1 for r in records if r.tenant == t) for t in WEIGHTS}
            _top_up(q, enqueued, started, args.keep, args.work_ms)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        q.close()
    records = read_records(out)
    first = min(r.start for r in records)
    counted = [r for r in records if r.start >= first + WARM_UP_S]
    span = max(r.start for r in counted) - min(r.start for r in counted)
    starts = {t: sum(1 for r in counted if r.tenant == t) for t in WEIGHTS}
    ratio = starts["gold"] / max(1, starts["basic"])
    result = {
        "seconds": round(span, 1),
        "starts": starts,
        "ratio": round(ratio, 3),
        "target": "3.0 within 10 % (2.7 to 3.3)",
        "within_target": 2.7 <= ratio <= 3.3,
        "workers": args.workers,
        "work_ms": args.work_ms,
        "store": url.split(":", 1)[0],
        "machine": machine(),
    }
    (folder / "weights.json").write_text(json.dumps(result, indent=2))
    log(f"results in {folder}")
    print(json.dumps({k: result[k] for k in ("seconds", "starts", "ratio", "within_target")}))
    sys.exit(0)


if __name__ == "__main__":
    main()
