"""Workload (iii) of the peer benchmarks with quick's peer config as it is (sqlite, one
consumer process): 300 items delayed 0.5-3 s; lateness = handler start - due time.
PYTHONPATH=. python delayed_probe.py"""
import json
import tempfile
from pathlib import Path

import bench.peers.quick_peer as qp
from bench import peer_workloads as w

with tempfile.TemporaryDirectory() as d:
    peer = qp.QuickPeer(Path(d), "sqlite")
    try:
        r = w.delayed(peer, 300, 0.5, 3.0)
    finally:
        peer.close()
print(json.dumps({"workload": "delayed", "one_transaction_visits": qp.peer_config().one_transaction_visits,
                  "p50": r["p50"], "p99": r["p99"], "max": r["max"], "early": r["early"]}))
