"""The diagnostic probe behind README.md's "Where the time goes": one noisy-neighbour run
whose consumer (diagnose_runner.py) logs its scans, visits, commits and dequeues; prints
the split of the small tenants' pickup time, the cycle's timings and the consumer's CPU.

PYTHONPATH=. python bench/results/20261124T123000Z-fewest-held/diagnose_probe.py ['{overrides}']
(a scratch script, kept as it ran, apart from how it starts the workload)
"""
import json, sys, tempfile, collections, statistics
from pathlib import Path
import bench.peers.quick_peer as qp
from bench import peer_workloads as w
HERE = Path(__file__).resolve().parent
extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
evfile = tempfile.mktemp(suffix=".json")
saved = {}
import time as _t
enq_times = []
_enq = qp.QuickPeer.enqueue
def timed_enq(self, tenant, work_ms=0.0):
    a = _t.time(); _enq(self, tenant, work_ms); enq_times.append((a, (_t.time() - a) * 1000))
qp.QuickPeer.enqueue = timed_enq
_rr = w.read_records
def rr(p):
    r = _rr(p); saved["recs"] = r; return r
w.read_records = rr
r = qp.run_on_sqlite(
    lambda peer: w.noisy_neighbour(peer, 10, 5.0, 5.0),
    overrides=extra,
    consumer=lambda url, config: [sys.executable, str(HERE / "diagnose_runner.py"), url, config, evfile],
)
recs = saved["recs"]
ev = json.load(open(evfile))
t0 = min(x.enq for x in recs if x.tenant == "noisy")
# join small tenants' records and dequeued events by tenant + order
deq = collections.defaultdict(list)
for kind, ten, a, t, *_ in ev:
    if kind == "d" and ten.startswith("t"): deq[ten].append((a, t))
st = collections.defaultdict(list)
for x in recs:
    if x.tenant.startswith("t"): st[x.tenant].append(x)
rows = []
for ten, xs in st.items():
    xs.sort(key=lambda x: x.enq); ds = sorted(deq[ten])
    for x, (a, t) in zip(xs, ds):
        rows.append((x.enq - t0, (t - x.enq)*1000, (x.start - t)*1000, (x.start-x.enq)*1000))
drain = max(x.start for x in recs if x.tenant == "noisy") - t0
during = [r for r in rows if r[0] < drain]
after = [r for r in rows if r[0] >= drain]
def q(v, p): v = sorted(v); return v[min(len(v)-1, int(len(v)*p/100))]
print(json.dumps({"extra": extra, "p50": round(r["small"]["p50"],1), "p99": round(r["small"]["p99"],1), "drain_s": round(drain,3),
  "n_during": len(during), "n_over20": sum(1 for r_ in rows if r_[3] > 20),
  "during_enq2deq_p50/p90": [round(q([r_[1] for r_ in during], 50),1), round(q([r_[1] for r_ in during], 90),1)],
  "during_deq2start_p50/p90": [round(q([r_[2] for r_ in during], 50),1), round(q([r_[2] for r_ in during], 90),1)],
  "after_enq2deq_p50/p90": [round(q([r_[1] for r_ in after], 50),1), round(q([r_[1] for r_ in after], 90),1)],
  "after_deq2start_p50/p90": [round(q([r_[2] for r_ in after], 50),1), round(q([r_[2] for r_ in after], 90),1)],
}))
# timeline during drain
evs = [(t - t0, k, a) for k, ten, a, t in [(e[0], e[1], e[2], e[3]) for e in ev] if k in ("scan", "visits_batched")]
evs.sort()
scans = [t for t, k, a in evs if k == "scan" and 0 < t < drain]
import statistics as S
gaps = [b - a for a, b in zip(scans, scans[1:])]
print("scans during drain", len(scans), "gap ms p50/p90/max", round(S.median(gaps)*1000,1), round(sorted(gaps)[int(len(gaps)*.9)]*1000,1), round(max(gaps)*1000,1))
vb = [(t, a) for t, k, a in evs if k == "visits_batched" and 0 < t < drain]
print("batches during drain", len(vb), "zones/batch mean", round(S.mean(a for t, a in vb),2))
fl = [e[2] for e in ev if e[0] == "scan" and 0 < e[3]-t0 < drain]
ptr = [e[1] for e in ev if e[0] == "scan" and 0 < e[3]-t0 < drain]
print("inflight at scan: hist", collections.Counter(fl).most_common(), "pointers chosen mean", S.mean(ptr))

for tag in ("T_scan", "T_visit", "T_commit", "T_begin"):
    xs = [e for e in ev if e[0] == tag and 0 < e[3] - t0 < drain]
    wall = sorted(e[4] for e in xs); cpu = sorted(e[2] for e in xs)
    if xs: print(tag, len(xs), "wall p50/p90", round(wall[len(wall)//2],2), round(wall[int(len(wall)*.9)],2), "cpu p50/p90", round(cpu[len(cpu)//2],2), round(cpu[int(len(cpu)*.9)],2))

d_ = sorted(x for a, x in enq_times if 0 < a - t0 < drain); a_ = sorted(x for a, x in enq_times if a - t0 > drain)
print("enqueue ms during drain p50/p90/max", round(d_[len(d_)//2],2), round(d_[int(len(d_)*.9)],2), round(d_[-1],2), "after p50/p90", round(a_[len(a_)//2],2), round(a_[int(len(a_)*.9)],2))
import bisect
scan_starts = sorted(e[3] for e in ev if e[0] == "T_scan")
visit_starts = sorted(e[3] for e in ev if e[0] == "T_visit")
enq_done = {}
for a, x in enq_times: enq_done[round(a, 6)] = a + x / 1000
w1, w2, w3 = [], [], []
for ten, xs in st.items():
    xs.sort(key=lambda x: x.enq); ds = sorted(deq[ten])
    for x, (a_, t) in zip(xs, ds):
        if not (0 < x.enq - t0 < drain): continue
        done = min((v for k, v in enq_done.items() if abs(k - x.enq) < 2e-6), default=None)
        if done is None: continue
        i = bisect.bisect_left(scan_starts, done)
        if i >= len(scan_starts): continue
        s0 = scan_starts[i]
        j = bisect.bisect_right(visit_starts, t) - 1
        w1.append((done - x.enq) * 1000); w2.append((s0 - done) * 1000); w3.append((t - s0) * 1000)
for name, v in (("enqueue", w1), ("wait for next scan", w2), ("scan start -> dequeued", w3)):
    v.sort(); print(name, "p50/p90/p99", round(v[len(v)//2],1), round(v[int(len(v)*.9)],1), round(v[int(len(v)*.99)],1))

sc_ = [(e[3], e[4]) for e in ev if e[0] == "scan" and 0.05 < e[3]-t0 < drain]
print("consumer CPU during drain: %.0f%%" % ((sc_[-1][1]-sc_[0][1])/(sc_[-1][0]-sc_[0][0])*100))
sc_ = [(e[3], e[4]) for e in ev if e[0] == "scan" and drain + 0.5 < e[3]-t0 < 5]
print("consumer CPU after drain: %.0f%%" % ((sc_[-1][1]-sc_[0][1])/(sc_[-1][0]-sc_[0][0])*100))

tm = [e for e in ev if e[0] == "times"][0]; print("user %.2f s, system %.2f s" % (tm[3], tm[4]))
sc2 = sorted((e[3], e[3] + e[4] / 1000) for e in ev if e[0] == "T_scan" and 0 < e[3] - t0 < drain)
vi2 = sorted((e[3], e[3] + e[4] / 1000) for e in ev if e[0] == "T_visit" and 0 < e[3] - t0 < drain)
h1, h2 = [], []
for s0, s1 in sc2:
    i = bisect.bisect_left([v[0] for v in vi2], s1)
    if i < len(vi2): h1.append((vi2[i][0] - s1) * 1000)
for v0, v1 in vi2:
    i = bisect.bisect_left([s[0] for s in sc2], v1)
    if i < len(sc2): h2.append((sc2[i][0] - v1) * 1000)
for name, v in (("scan end -> visit start", h1), ("visit end -> next scan", h2)):
    v.sort(); print(name, "p50/p90", round(v[len(v)//2],2), round(v[int(len(v)*.9)],2))
