"""Medians per variant of the A/B runs .dev/ab.sh wrote."""
import json, statistics as st, sys
from pathlib import Path
O = Path(sys.argv[1])
rows: dict = {}
for f in O.glob("n-*/noisy_pickup.json"):
    v = f.parent.name.split("-")[1]
    s = json.loads(f.read_text())["summary"].get("quick-sqlite", {})
    for k in ("small_p99", "small_p50", "small_p99_after_burst"):
        if k in s:
            rows.setdefault(v, {}).setdefault(k, []).append(s[k]["median"])
for f in O.glob("l-*/lone_tenant.json"):
    v = f.parent.name.split("-")[1]
    d = json.loads(f.read_text())
    for name, key in (("quick-sqlite-user", "rate"), ("huey", "huey")):
        for k2, r in d.get("rates", {}).items():
            if k2.startswith(name) and r["median"] == r["median"]:
                rows.setdefault(v, {}).setdefault(key, []).append(r["median"])
    c = d.get("cpu_s_per_1000_items", {}).get("quick-sqlite-user")
    if c:
        rows.setdefault(v, {}).setdefault("cpu", []).append(c["median"])
def med(x): return f"{st.median(x):.1f} (n={len(x)})" if x else "-"
print("| variant | small p99 ms | small p50 ms | p99 after burst | lone items/s | CPU s/1000 | Huey items/s |")
print("|---|---|---|---|---|---|---|")
for v in sorted(rows, key=lambda v: (v != "A", v)):
    r = rows[v]
    print(f"| {v} | {med(r.get('small_p99', []))} | {med(r.get('small_p50', []))} | {med(r.get('small_p99_after_burst', []))} | {med(r.get('rate', []))} | {med([c*1000 for c in r.get('cpu', [])])} | {med(r.get('huey', []))} |")
print("\nCPU column in ms per 1000 items. FDB scaling runs:")
for f in sorted(O.glob("fdb-*/scaling.json")):
    try:
        d = json.loads(f.read_text())
        print(f.parent.name, "; ".join(f"{r['processes']}p {r['items_per_s']:.0f}/s x{r['ratio_to_one']:.2f} lost {r['pointer_leases_lost']}/{r['pointer_leases']}" for r in d["rows"]))
    except Exception as e:
        print(f, e)
