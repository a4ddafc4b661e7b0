"""Split small tenants' pickup into enqueue commit time and the rest."""
import json, statistics, sys, time, tempfile
from pathlib import Path
from bench import peer_workloads as w
from bench.common import read_records
from bench.peers.quick_peer import QuickPeer

done: dict[str, float] = {}

class P(QuickPeer):
    def enqueue(self, tenant, work_ms=0.0):
        t = time.time()
        self.q.enqueue("bench", {"t": tenant, "e": t, "d": t, "w": work_ms}, app="b", tenant=tenant)
        done[f"{t:.6f}"] = time.time()

def pct(xs, p):
    xs = sorted(xs); return round(xs[min(len(xs)-1, int(p*len(xs)))], 1)

extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
for run in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    done.clear()
    with tempfile.TemporaryDirectory() as d:
        peer = P(Path(d), "sqlite", overrides=extra)
        try:
            r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
            recs = read_records(peer.out)
        finally:
            peer.close()
    tot, enq, rest = [], [], []
    for rec in recs:
        if not rec.tenant.startswith("t"): continue
        key = f"{rec.enq:.6f}"
        c = done.get(key)
        if c is None:
            # precision mismatch: nearest
            continue
        tot.append((rec.start - rec.enq) * 1000); enq.append((c - rec.enq) * 1000); rest.append((rec.start - c) * 1000)
    t0 = min(r.enq for r in recs if r.tenant == "noisy")
    nend = max(r.start for r in recs if r.tenant == "noisy") - t0
    offs = [rec.enq - t0 for rec in recs if rec.tenant.startswith("t") and f"{rec.enq:.6f}" in done]
    worst = sorted(zip(tot, enq, rest, offs), reverse=True)[:12]
    print("noisy drained at", round(nend, 2), "during-drain small p99", pct([a for a, o in zip(tot, offs) if o < nend], .99), "after", pct([a for a, o in zip(tot, offs) if o >= nend], .99), "n during", sum(1 for o in offs if o < nend))
    print(json.dumps({"n": len(tot), "p99": pct(tot, .99), "enq_p50": pct(enq, .5), "enq_p99": pct(enq, .99), "rest_p50": pct(rest, .5), "rest_p99": pct(rest, .99), "worst": [(round(a,1), round(b,1), round(c,1), round(o,2)) for a,b,c,o in worst]}), flush=True)
