"""noisy_neighbour (100 small tenants x 10 items over 5 s, a 1,000-item burst, 5 ms jobs),
quick's peer config with overrides, one consumer process on sqlite (or memory in-process).

PYTHONPATH=. python noisy_neighbour_probe.py sqlite one|three|default ['{"managers": 8}']
("default": the peer config as it is, no one_transaction_visits override)
"""
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import bench.peers.quick_peer as qp
from bench import peer_workloads as w

mode = sys.argv[2]
extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
if mode != "default":
    extra["one_transaction_visits"] = mode == "one"
_orig = qp.peer_config
qp.peer_config = lambda throughput=False: dataclasses.replace(_orig(throughput), **extra)
backend = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    peer = qp.QuickPeer(Path(d), backend)
    try:
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
    finally:
        peer.close()
s, n, a = r["small"], r["noisy"], r["small_after_burst"]
print(json.dumps({"backend": backend, "mode": mode, "extra": extra, "small_p50": s["p50"],
                  "small_p99": s["p99"], "after_burst_p99": a["p99"], "noisy_p50": n["p50"],
                  "noisy_p99": n["p99"]}))
