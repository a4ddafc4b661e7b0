"""One noisy-neighbour run (peer workload ii, sqlite, quick's peer fairness profile) with
the fewest-held-first ordering on ("held") or off ("noheld"). One JSON line, then the
consumer's context switches per thread.

PYTHONPATH=. python bench/results/20261124T123000Z-fewest-held/ab.py held|noheld
"""

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import bench.peers.quick_peer as qp
from bench import peer_workloads as w
from bench.quickrun import config_to_json

HERE = Path(__file__).resolve().parent
variant = sys.argv[1]
extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
_profile = qp.peer_config
qp.peer_config = lambda throughput=False: dataclasses.replace(_profile(throughput), **extra)
if variant == "noheld":
    os.environ["NOHELD"] = "1"
ctx = tempfile.mktemp(suffix=".json")
os.environ["CTXOUT"] = ctx
qp.QuickPeer.worker_cmd = lambda self: [
    sys.executable,
    str(HERE / "runner.py"),
    self._url(),
    config_to_json(qp.peer_config(self.throughput)),
]
with tempfile.TemporaryDirectory() as d:
    peer = qp.QuickPeer(Path(d), "sqlite")
    try:
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
    finally:
        peer.close()
print(json.dumps({
    "variant": variant, "extra": extra, "small_p50": r["small"]["p50"],
    "small_p99": r["small"]["p99"], "small_max": r["small"]["max"],
    "noisy_p50": r["noisy"]["p50"], "ran": r["ran"], "expected": r["expected"],
}))
print(open(ctx).read())
os.unlink(ctx)
