"""Pooled stage numbers (ms) over the saved stage_probe traces: python summarize_stages.py a.json b.json ..."""
import gzip, json, sys

STAGES = ["total", "part_one", "part_two", "to_scan", "scan_to_visit", "lease", "dequeue",
          "local_queue", "exec_to_handler"]


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    return xs[min(len(xs) - 1, max(0, int(round(q / 100 * len(xs) + 0.5)) - 1))] if xs else float("nan")


rows, busy, commits = [], [], []
for p in sys.argv[1:]:
    d = json.load(gzip.open(p) if p.endswith(".gz") else open(p))
    rs = d["rows"]
    t0 = min(r["e"] for r in rs)
    # when the noisy backlog was drained: the last noisy visit
    noisy_end = max((v["t1"] for v in d["visits"] if v.get("zone") == "noisy"), default=t0)
    for r in rs:
        r["phase"] = "noisy" if r["e"] < noisy_end else "after"
    rows += rs
    lo, hi = t0, noisy_end
    b = sum(max(0, min(v["t1"], hi) - max(v["t0"], lo)) for v in d["visits"])
    busy.append(b / (4 * (hi - lo)))
    nv = [v for v in d["visits"] if lo <= v["t0"] < hi]
    commits.append((len(nv) / (hi - lo), sum(1 for c in d["commits"] if lo <= c[1] < hi) / (hi - lo),
                    sum(c[2] for c in d["commits"] if lo <= c[1] < hi) / max(1, sum(1 for c in d["commits"] if lo <= c[1] < hi)) * 1000,
                    sum(c[3] for c in d["commits"] if lo <= c[1] < hi) / max(1, sum(1 for c in d["commits"] if lo <= c[1] < hi)) * 1000,
                    hi - lo))
print("runs %d, small items %d (%d while the noisy backlog lasted)" % (len(sys.argv) - 1, len(rows), sum(r["phase"] == "noisy" for r in rows)))
print("%-16s %7s %7s | %7s %7s | %7s %7s" % ("stage (ms)", "p50", "p99", "noisy50", "noisy99", "after50", "after99"))
for k in STAGES:
    a = [r[k] for r in rows]
    nz = [r[k] for r in rows if r["phase"] == "noisy"]
    af = [r[k] for r in rows if r["phase"] == "after"]
    print("%-16s %7.1f %7.1f | %7.1f %7.1f | %7.1f %7.1f" % (k, pct(a, 50), pct(a, 99), pct(nz, 50), pct(nz, 99), pct(af, 50), pct(af, 99)))
print("manager busy while the noisy backlog lasted (4 managers):", " ".join("%.2f" % x for x in busy))
print("while noisy backlog lasted: visits/s, consumer commits/s, commit ms (mean), of which in-process write-lock wait ms, backlog s:")
for c in commits:
    print("   %.0f  %.0f  %.2f  %.2f  %.1f" % c)
