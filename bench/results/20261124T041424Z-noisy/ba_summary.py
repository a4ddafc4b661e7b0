"""Medians of the interleaved before/after runs: python ba_summary.py (in this folder)."""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
runs = [json.loads(line) for line in (HERE / "before_after.jsonl").open()]
before = [r for r in runs if r["tree"] == "before"]
after = [r for r in runs if r["tree"] == "after"]
print("noisy neighbour, sqlite, %d before / %d after runs (interleaved pairs)" % (len(before), len(after)))
for k in ["small_p50", "small_p99", "noisy_p50", "noisy_p99"]:
    b = [r[k] for r in before]
    a = [r[k] for r in after]
    print("  %-10s median before %7.1f  after %7.1f   before %s | after %s" % (
        k, statistics.median(b), statistics.median(a),
        " ".join("%.0f" % x for x in b), " ".join("%.0f" % x for x in a)))
wins = sum(a["small_p99"] < b["small_p99"] for b, a in zip(before, after))
print("  pairs where after's small p99 is lower: %d of %d" % (wins, min(len(before), len(after))))
p = HERE / "before_after_delayed.jsonl"
if p.exists():
    runs = [json.loads(line) for line in p.open()]
    for tree in ("before", "after"):
        rs = [r for r in runs if r["tree"] == tree]
        print("delayed (300 items, 0.5-3 s), %s: p99 median %.1f ms (%s), p50 median %.1f, early %s" % (
            tree, statistics.median(r["p99"] for r in rs), " ".join("%.1f" % r["p99"] for r in rs),
            statistics.median(r["p50"] for r in rs), " ".join(str(r["early"]) for r in rs)))
