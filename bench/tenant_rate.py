"""A per-tenant rate limit of 10 starts a second over a minute, 4 consumer processes
(issue 31's target: holds within 5 %).

``python -m bench.tenant_rate [--seconds 60] [--rate 10] [--processes 4] [--store URL]``

``quick worker --processes 4`` (:mod:`bench.user_app`, every other setting at its default)
runs a backlog of tenant ``limited`` (``quick limit set --rate 10``, enough items for the
whole run and more) beside tenant ``free`` (no limit, as many items, to show that it is
not held back). The rate counts the limited tenant's starts from the jobs' own records
(:func:`bench.common.record_start`): (starts - 1) / (last - first) over the run, and the
most starts in any one-second window. Results:
``bench/results/<UTC timestamp>-tenant-rate/tenant_rate.json``.
"""

from __future__ import annotations

import json
import subprocess
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


def main() -> None:
    ap = store_run_parser(__doc__)
    ap.add_argument("--rate", type=int, default=10)
    ap.add_argument("--processes", type=int, default=4)
    args = ap.parse_args()
    folder = run_folder("tenant-rate", args.out)
    out = folder / "starts.txt"
    url = store_url(args.store, "rate.db")
    q = Quick.open(url)
    q.set_tenant_limit("bench", "limited", rate=args.rate, per=1.0)
    n = int(args.rate * (args.seconds + 10) * 1.5)
    now = time.time()
    for tenant in ("limited", "free"):
        payload = {"t": tenant, "e": now, "d": now}
        q.enqueue_many(JOB, [payload] * n, app="bench", tenant=tenant)
    q.close()
    env = child_env(BENCH_OUT=str(out), QUICK_STORE=url)
    cmd = [*user_worker_cmd(1)[:-2], "--processes", str(args.processes)]
    worker = subprocess.Popen(cmd, env=env)
    try:
        time.sleep(args.seconds)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    records = read_records(out)
    limited = sorted(r.start for r in records if r.tenant == "limited")
    free = sum(1 for r in records if r.tenant == "free")
    span = limited[-1] - limited[0]
    rate = (len(limited) - 1) / span
    most, j = 0, 0
    for i, t in enumerate(limited):  # the most starts in any window [t, t + 1 s)
        while limited[j] < t - 1.0:
            j += 1
        most = max(most, i - j + 1)
    result = {
        "seconds": round(span, 1),
        "limited_starts": len(limited),
        "rate_per_s": round(rate, 3),
        "over_limit_pct": round((rate / args.rate - 1) * 100, 2),
        "most_in_one_second": most,
        "free_starts": free,
        "target": f"{args.rate}/s within 5 %",
        "within_target": rate <= args.rate * 1.05,
        "processes": args.processes,
        "store": url.split(":", 1)[0],
        "machine": machine(),
    }
    (folder / "tenant_rate.json").write_text(json.dumps(result, indent=2))
    log(f"results in {folder}")
    print(json.dumps({k: result[k] for k in ("seconds", "limited_starts", "rate_per_s",
                                              "most_in_one_second", "free_starts",
                                              "within_target")}))  # fmt: skip


if __name__ == "__main__":
    main()
