"""Where the small tenants' slowest pickups sit in workload (ii): during the noisy
tenant's burst (enqueued before its last batch committed) or after it. One JSON line per
run: p99 of all small items, of those enqueued during / after the burst, how many of the
20 slowest were enqueued during it, and burst_s.

    PYTHONPATH=. python tail_where.py RUNS ['{overrides}']
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
import time
from typing import Any

from bench import peer_workloads as w
from bench.common import read_records
from bench.peers.quick_peer import QuickPeer, run_on_sqlite


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def one(extra: dict[str, Any]) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def work(peer: QuickPeer) -> dict[str, Any]:
        calls: list[tuple[float, float]] = []
        plain = peer.enqueue

        def timed(tenant: str, work_ms: float = 0.0) -> None:
            t = time.time()
            plain(tenant, work_ms)
            calls.append((t, (time.time() - t) * 1000))

        peer.enqueue = timed  # type: ignore[method-assign]
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
        box["calls"] = calls
        recs = read_records(peer.out)
        t0 = min(x.enq for x in recs if x.tenant == w.NOISY)
        small = [((x.start - x.enq) * 1000, x.enq - t0) for x in recs if x.tenant.startswith("t")]
        box["small"] = small
        box["t0"] = t0
        box["end"] = r["burst_s"]
        return r

    run_on_sqlite(work, overrides=extra)
    small, burst = box["small"], box["end"]
    calls, t0 = box["calls"], box["t0"]
    during = [lat for lat, at in small if at <= burst]
    after = [lat for lat, at in small if at > burst]
    worst = sorted(small, reverse=True)[:20]
    # Each small item's enqueue call (the producer's side of its pickup): the call that
    # began last at or before its stamp.
    starts = sorted(calls)
    begins = [t for t, _ in starts]

    def call_ms(at: float) -> float:
        i = bisect.bisect_right(begins, at + t0) - 1
        return starts[i][1] if i >= 0 else 0.0

    worst_call = [round(call_ms(at), 1) for _, at in worst[:10]]
    return {
        "p50": round(pct([lat for lat, _ in small], 0.5), 1),
        "p99": round(pct([lat for lat, _ in small], 0.99), 1),
        "p99_after": round(pct(after, 0.99), 1),
        "n_during": len(during),
        "max_during": round(max(during, default=0.0), 1),
        "worst20_during": sum(1 for _, at in worst if at <= burst),
        "worst20_in_first_s": sum(1 for _, at in worst if at <= 1.0),
        "worst10": [round(lat, 1) for lat, _ in worst[:10]],
        "worst10_at": [round(at, 2) for _, at in worst[:10]],
        "worst10_call": worst_call,
        "burst_s": round(burst, 3),
        "enqueue_call_p99": round(pct([d for _, d in calls], 0.99), 1),
        "enqueue_call_max": round(max(d for _, d in calls), 1),
        "slow_calls": sorted(round(d, 1) for _, d in calls if d > 5)[-12:],
    }


def main() -> None:
    runs = int(sys.argv[1])
    extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    out = []
    for _ in range(runs):
        res = one(extra)
        out.append(res)
        print(json.dumps(res), flush=True)
    for k in ("p50", "p99", "p99_after", "burst_s"):
        print(k, statistics.median(r[k] for r in out))


if __name__ == "__main__":
    main()
