import json, sys, statistics, collections
g = collections.defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    key = (d["mode"], json.dumps(d["extra"]), d.get("nogate", False), d.get("tag", ""))
    g[key].append(d)
keys = ["small_p50", "small_p90", "small_p99", "small_mean", "noisy_p50", "noisy_p99", "conflicts", "to_scan_p99", "scan_to_visit_p99", "lease_p99", "dequeue_p99"]
for k, ds in g.items():
    print(k, "n=%d" % len(ds))
    for m in keys:
        xs = [d[m] for d in ds if m in d]
        if xs:
            print("   %-18s median %8.1f   runs %s" % (m, statistics.median(xs), " ".join("%.0f" % x for x in xs)))
