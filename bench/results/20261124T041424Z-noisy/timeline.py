import json, sys, statistics
d = json.load(open(sys.argv[1]))
rows = d["rows"]; scans = d["scans"]; visits = d["visits"]
t0 = min(r["e"] for r in rows)
B = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
def b(t): return int((t - t0) / B)
from collections import defaultdict
agg = defaultdict(lambda: {"lat": [], "scans": 0, "chosen": [], "visits": [], "noisyv": 0, "items": 0})
for r in rows: agg[b(r["e"])]["lat"].append(r["total"])
for s in scans:
    a = agg[b(s[1])]; a["scans"] += 1; a["chosen"].append(len(s[2]))
for v in visits:
    a = agg[b(v["t0"])]; a["visits"].append((v["t1"]-v["t0"])*1000); a["items"] += v.get("items", 0)
    if v.get("zone") == "noisy": a["noisyv"] += 1
print("bin  n  lat_med lat_max | scans chosen_avg | visits noisyv items visit_ms_med")
for k in sorted(agg):
    if k < 0 or k > 60: continue
    a = agg[k]
    print("%4.1f %3d %6.1f %6.1f | %4d %5.1f | %4d %3d %4d %5.1f" % (k*B, len(a["lat"]), statistics.median(a["lat"]) if a["lat"] else 0, max(a["lat"]) if a["lat"] else 0, a["scans"], statistics.mean(a["chosen"]) if a["chosen"] else 0, len(a["visits"]), a["noisyv"], a["items"], statistics.median(a["visits"]) if a["visits"] else 0))
if "commits" in d:
    print("commits per 0.5 s: thread class -> n, mean total ms, mean lock wait, mean begin_immediate")
    cb = defaultdict(lambda: defaultdict(list))
    for name, t, tot, lw, bg in d["commits"]:
        cb[int((t - t0) / 0.5)][name].append((tot, lw, bg))
    cpu = d["cpu"]
    for k in sorted(cb):
        if k < 0 or k > 11: continue
        lo, hi = t0 + k * 0.5, t0 + (k + 1) * 0.5
        pts = [c for c in cpu if lo <= c[0] < hi]
        util = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else float("nan")
        parts = []
        for name, xs in sorted(cb[k].items()):
            n = len(xs)
            parts.append("%s n=%d tot=%.2f lw=%.2f bg=%.2f" % (name, n, 1000*sum(x[0] for x in xs)/n, 1000*sum(x[1] for x in xs)/n, 1000*sum(x[2] for x in xs)/n))
        print("%4.1f cpu=%.2f  " % (k * 0.5, util) + " | ".join(parts))
