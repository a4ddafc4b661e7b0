import json, sys, time, tempfile, bisect
from pathlib import Path
from bench import peer_workloads as w
from bench.common import read_records
from bench.peers.quick_peer import QuickPeer
import sys; sys.path.insert(0, '/tmp/probe'); import ckpatch
done = {}
class P(QuickPeer):
    def enqueue(self, tenant, work_ms=0.0):
        t = time.time()
        self.q.enqueue("bench", {"t": tenant, "e": t, "d": t, "w": work_ms}, app="b", tenant=tenant)
        done[f"{t:.6f}"] = time.time()
extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
with tempfile.TemporaryDirectory() as dd:
    peer = P(Path(dd), "sqlite", overrides=extra, consumer=lambda url, config: ["/tmp/venv/bin/python", "/tmp/probe/consumer.py", url, "--config", config])
    try:
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
        recs = read_records(peer.out)
    finally:
        peer.close()
d = json.load(open("/tmp/probe/events.json"))
print("p99", round(r["small"]["p99"], 1))
sc = sorted(d["scans"]); vs = sorted(d["visits"])
t0 = min(x.enq for x in recs if x.tenant == "noisy")
small = [x for x in recs if x.tenant.startswith("t") and f"{x.enq:.6f}" in done]
small.sort(key=lambda x: x.start - x.enq, reverse=True)
for x in small[:int(sys.argv[2]) if len(sys.argv) > 2 else 6]:
    c = done[f"{x.enq:.6f}"]
    print(f"-- {x.tenant} at {x.enq - t0:.3f}s total {1000*(x.start-x.enq):.1f} ms, commit after {1000*(c-x.enq):.1f} ms")
    ev = [(s[0], f"scan {1000*s[1]:.1f}ms found {s[2]}") for s in sc if c - 0.002 <= s[0] <= x.start] + [(v[0], f"visit {1000*v[1]:.1f}ms cpu {1000*v[2]:.1f} zones {v[3]} items {v[4]}") for v in vs if c - 0.01 <= v[0] <= x.start] + [(k[0], f"CONSUMER ckpt {k[2]} {1000*k[1]:.1f}ms {k[3]}") for k in d["ck"] if c - 0.03 <= k[0] <= x.start] + [(k[0], f"PRODUCER ckpt {k[2]} {1000*k[1]:.1f}ms {k[3]}") for k in ckpatch.CK if c - 0.03 <= k[0] <= x.start] + [(g[0], f"GC gen{g[2]} {1000*g[1]:.1f}ms") for g in d["gcs"] if c - 0.01 <= g[0] <= x.start and g[1] > 0.0005] + [(i[0], f"idle wait {1000*i[1]:.1f}ms (timeout {1000*i[2]:.1f})") for i in d["iwaits"] if c - 0.01 <= i[0] <= x.start] + [(f[0], f"      flush {1000*f[1]:.1f}ms cpu {1000*f[2]:.1f} n {f[3]}") for f in d["flushes"] if c - 0.01 <= f[0] <= x.start and f[3]] + [(wt[0], f"   lock wait {1000*wt[1]:.1f}ms") for wt in d["waits"] if c - 0.01 <= wt[0] <= x.start and wt[1] > 0.0005] + [(e[0], "   " + e[1]) for e in d["timeline"] if e[1] == "one_transaction_visit_conflict" and c - 0.01 <= e[0] <= x.start]
    for t, what in sorted(ev): print(f"   +{1000*(t-c):6.1f}  {what}")

import collections
by = collections.defaultdict(list)
for g in d["gcs"]: by[g[2]].append(g[1]*1000)
print("gc objects", d["gcobjs"], {k: (len(v), round(sum(v),1), round(max(v),1)) for k, v in sorted(by.items())})

print("consumer ckpts", [(k[2], round(1000*k[1],1)) for k in d["ck"]][:40])
print("producer ckpts", [(k[2], round(1000*k[1],1)) for k in ckpatch.CK][:40])

def summ(name, hs):
    import statistics
    by = collections.defaultdict(list)
    for a, h, n, th in hs: by[th.rsplit("-", 1)[0] if th[-1].isdigit() else th].append((h * 1000, n))
    for th, v in by.items():
        hold = sorted(x[0] for x in v)
        print(f"{name} {th}: commits {len(v)} hold p50 {hold[len(hold)//2]:.2f} p99 {hold[int(len(hold)*.99)]:.2f} max {hold[-1]:.1f} sum {sum(hold):.0f} ms; points p50 {sorted(x[1] for x in v)[len(v)//2]}")
summ("consumer", d["holds"]); summ("producer", ckpatch.HOLDS)
