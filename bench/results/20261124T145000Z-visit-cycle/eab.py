import json, sys, os, statistics as st, tempfile
from bench import peer_workloads as w
from bench.peers.quick_peer import run_on_sqlite
os.environ["EVOUT"] = os.path.join(tempfile.gettempdir(), "quick-eab-ev.json")
extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
r = run_on_sqlite(lambda peer: w.noisy_neighbour(peer, 10, 5.0, 5.0), overrides=extra,
    consumer=lambda url, config: [sys.executable, "bench/results/20261124T145000Z-visit-cycle/ev_runner.py", url, config])
print(json.dumps({"p50": round(r["small"]["p50"],1), "p99": round(r["small"]["p99"],1), "noisy_p50": round(r["noisy"]["p50"]), "ran": r["ran"]}))
d = json.load(open(os.environ["EVOUT"]))
print({k: v for k, v in sorted(d["cnt"].items()) if v > 5})
vis = d["vis"]
noisy = [v for v in vis if v[5] > 0]
end = max(v[0] for v in noisy)
dur = [v for v in vis if v[0] <= end]
print("drain visits", len(dur), "span s", round(end - dur[0][0], 2))
for name, sel in (("all", dur), ("with noisy", [v for v in dur if v[5]]), ("without noisy", [v for v in dur if not v[5]])):
    if sel: print(name, len(sel), "refs", round(st.mean(v[1] for v in sel),2), "items", round(st.mean(v[4] for v in sel),2), "noisy items", round(st.mean(v[5] for v in sel),2), "wall p50/p90", round(st.median(v[2] for v in sel),2), round(sorted(v[2] for v in sel)[int(len(sel)*.9)],2), "cpu p50/p90", round(st.median(v[3] for v in sel),2), round(sorted(v[3] for v in sel)[int(len(sel)*.9)],2))
