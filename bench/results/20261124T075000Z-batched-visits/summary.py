"""Medians of runs.jsonl per workload and setting: python summary.py runs.jsonl"""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
for workload, metrics in (("noisy", ("small_p50", "small_p99", "small_max", "noisy_p50", "noisy_p99")),
                          ("delayed", ("p50", "p99", "max", "early"))):
    for label, extra in (("one zone per transaction", {"visits_per_transaction": 1}), ("up to 16 zones", {}),
                         ("up to 16 zones, 1 manager", {"managers": 1})):
        rs = [r for r in rows if r["workload"] == workload and r["extra"] == extra]
        if not rs:
            continue
        print(f"{workload}, {label}: {len(rs)} runs")
        for m in metrics:
            xs = [r[m] for r in rs]
            print(f"  {m:10} median {statistics.median(xs):8.1f}   runs {' '.join(f'{x:.1f}' for x in xs)}")
        ev = [r["events"] for r in rs]
        print(f"  visits {statistics.median(e['visited'] for e in ev)}, visit transactions (one_tx tried)"
              f" {statistics.median(r['one_tx']['tried'] for r in rs)}, batches {statistics.median(e['visits_batched'] for e in ev)},"
              f" conflicts {statistics.median(e['one_transaction_visit_conflict'] for e in ev)}, completed {[e['completed'] for e in ev]}")
if any(r["workload"] == "noisy" for r in rows):
    pairs = [r for r in rows if r["workload"] == "noisy"]
    a = [r for r in pairs if r["extra"] == {"visits_per_transaction": 1}]; b = [r for r in pairs if not r["extra"]]
    print("pairs where 16 zones has the lower small p99:", sum(y["small_p99"] < x["small_p99"] for x, y in zip(a, b)), "of", len(a))
