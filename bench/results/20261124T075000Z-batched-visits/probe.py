"""One run of a peer-benchmark workload with quick's peer (sqlite, one consumer process),
its fairness profile with overrides, and the consumer's event counts.

PYTHONPATH=. python bench/results/20261124T075000Z-batched-visits/probe.py noisy|delayed '{"visits_per_transaction": 1}'

noisy: workload (ii), 100 small tenants x 10 items over 5 s, a 1,000-item burst, 5 ms jobs;
delayed: workload (iii), 300 items delayed 0.5-3 s. One JSON line.
"""

import json
import os
import sys
import tempfile

import bench.peers.quick_peer as qp
from bench import peer_workloads as w

workload = sys.argv[1]
extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
done = tempfile.mktemp(suffix=".json")


def consumer(url: str, config: str) -> list[str]:
    # bench.quickrun's own command, plus --done: its stats at SIGTERM.
    cmd = [sys.executable, "-m", "bench.quickrun", url, "--config", config]
    return cmd + ["--seconds", "3600", "--done", done]


def run(peer: qp.QuickPeer) -> dict[str, object]:
    if workload == "noisy":
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
        return {**w.flat_noisy(r), "ran": r["ran"], "expected": r["expected"]}
    r = w.delayed(peer, 300, 0.5, 3.0)
    return {"p50": r["p50"], "p99": r["p99"], "max": r["max"], "early": r["early"]}


out = qp.run_on_sqlite(run, overrides=extra, consumer=consumer)
stats = json.load(open(done))
os.unlink(done)
keep = ("visited", "visits_batched", "one_transaction_visit_conflict", "completed")
print(json.dumps({"workload": workload, "extra": extra, **out,
                  "events": {k: stats["stats"].get(k, 0) for k in keep},
                  "one_tx": stats["one_transaction_visits"]}))
