import sys, tempfile, json, dataclasses
from pathlib import Path
from bench import peer_workloads as w
import bench.peers.quick_peer as qp
one = sys.argv[2] == "one"
_orig = qp.peer_config
qp.peer_config = lambda throughput=False: dataclasses.replace(_orig(throughput), one_transaction_visits=one)
backend = sys.argv[1]
with tempfile.TemporaryDirectory() as d:
    peer = qp.QuickPeer(Path(d), backend)
    try:
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
    finally:
        peer.close() if hasattr(peer, "close") else None
s = r["small"]; n = r["noisy"]
print(backend, sys.argv[2], "small p50 %.1f p99 %.1f" % (s["p50"], s["p99"]), "noisy p50 %.1f p99 %.1f" % (n["p50"], n["p99"]))
