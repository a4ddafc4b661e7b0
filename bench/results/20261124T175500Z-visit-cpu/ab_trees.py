"""Interleaved A/B of two code trees on the noisy-neighbour workload (peer workload ii,
sqlite, the peer fairness profile): the consumer process runs under interpreter A (an
environment whose editable install points at the baseline tree) or B (the working tree),
alternately, ``pairs`` times; one JSON line per run, then the medians.

    PYTHONPATH=. python ab_trees.py noisy|small PYTHON_A PYTHON_B PAIRS ['{overrides}' ['{B's}']]

``small``: the same small tenants without the noisy one (the pickup path at light load).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys

import random
import time
from typing import Any

from bench import peer_workloads as w
from bench.common import latency_summary, read_records, wait_for_lines
from bench.peers.quick_peer import QuickPeer, run_on_sqlite


def small_only(peer: QuickPeer) -> dict[str, Any]:
    """Workload (ii) without its noisy tenant: the small tenants' items alone."""
    rng = random.Random(7)
    schedule = sorted(
        (rng.uniform(0, 5.0), f"t{i}") for i in range(w.SMALL_TENANTS) for _ in range(10)
    )
    peer.reset()
    peer.start_worker()
    try:
        peer.wait_ready()
        start = time.time()
        for at, tenant in schedule:
            delay = start + at - time.time()
            if delay > 0:
                time.sleep(delay)
            peer.enqueue(tenant, 5.0)
        wait_for_lines(peer.out, len(schedule) + 1, 60)
        recs = read_records(peer.out)
        small = [(r.start - r.enq) * 1000 for r in recs if r.tenant.startswith("t")]
        return {
            "small": latency_summary(small),
            "noisy": {"p50": 0.0},
            "burst_s": 0.0,
            "ran": len(small),
        }
    finally:
        peer.stop_worker()


WORKLOADS = {"noisy": lambda peer: w.noisy_neighbour(peer, 10, 5.0, 5.0), "small": small_only}


# ConsumerConfig fields a baseline tree at 0942165 lacks: dropped from A's config when
# AB_OLD_TREE is set (A then runs those features' defaults).
NEW_FIELDS = ("commit_poll_s", "skip_held_zones_at", "completion_flush_s")


def _for_baseline(config: str) -> str:
    fields = json.loads(config)
    for name in NEW_FIELDS:
        fields.pop(name, None)
    return json.dumps(fields)


def one(python: str, extra: dict[str, object], workload: str, baseline: bool) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_on_sqlite(
        WORKLOADS[workload],
        overrides=extra,
        consumer=lambda url, config: [
            python,
            "-m",
            "bench.quickrun",
            url,
            "--config",
            _for_baseline(config) if baseline else config,
            "--seconds",
            "3600",
        ],
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "p50": round(r["small"]["p50"], 1),
        "p99": round(r["small"]["p99"], 1),
        "max": round(r["small"]["max"], 1),
        "noisy_p50": round(r["noisy"]["p50"]),
        "burst_s": round(r["burst_s"], 2),
        "ran": r["ran"],
        "consumer_cpu_s": round(
            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2
        ),
        "nvcsw": after.ru_nvcsw - before.ru_nvcsw,
        "nivcsw": after.ru_nivcsw - before.ru_nivcsw,
    }


def main() -> None:
    workload, a, b, pairs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra_a = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    extra_b = json.loads(sys.argv[6]) if len(sys.argv) > 6 else extra_a
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for i in range(pairs):
        for name, python in (("A", a), ("B", b)) if i % 2 == 0 else (("B", b), ("A", a)):
            res = one(python, extra_a if name == "A" else extra_b, workload, name == "A" and bool(os.environ.get("AB_OLD_TREE")))
            runs[name].append(res)
            print(json.dumps({"run": name, **res}), flush=True)
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(json.dumps({"median": name, "n": len(rs), **med}), flush=True)


if __name__ == "__main__":
    main()
