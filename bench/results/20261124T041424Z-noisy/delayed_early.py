import tempfile
from pathlib import Path
import bench.peers.quick_peer as qp
from bench import peer_workloads as w
from bench.common import read_records
with tempfile.TemporaryDirectory() as d:
    peer = qp.QuickPeer(Path(d), "sqlite")
    try:
        r = w.delayed(peer, 300, 0.5, 3.0)
        recs = [x for x in read_records(peer.out) if x.tenant != "warmup"]
    finally:
        peer.close()
late = sorted((x.start - x.due) * 1000 for x in recs)
print(qp.peer_config().one_transaction_visits, "p99 %.1f" % r["p99"], "early:", [round(x, 3) for x in late if x < 0])
