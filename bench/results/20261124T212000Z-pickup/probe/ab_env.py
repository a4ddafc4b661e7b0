"""A/B on the noisy workload where A and B differ by environment variables (both processes)."""
import json, os, resource, statistics, sys, importlib
from bench import peer_workloads as w
from bench.peers.quick_peer import run_on_sqlite
env_a, env_b, pairs = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
from quickzones.backends.sqlite import store as st
def one(env):
    base = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if "QUICK_EXP_WAL" in env: st.WAL_CHECKPOINT_BYTES = int(env["QUICK_EXP_WAL"])
    if "QUICK_EXP_PAUSE" in env: st._EXP_PAUSE = float(env["QUICK_EXP_PAUSE"])
    try:
        r = run_on_sqlite(lambda p: w.noisy_neighbour(p, 10, 5.0, 5.0), overrides=extra,
            consumer=lambda url, config: [sys.executable, "-m", "bench.quickrun", url, "--config", config, "--seconds", "3600"])
    finally:
        for k, v in base.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v
        st.WAL_CHECKPOINT_BYTES = 16 * 1024 * 1024
        st._EXP_PAUSE = 0.004
    return {"p50": round(r["small"]["p50"], 1), "p99": round(r["small"]["p99"], 1), "max": round(r["small"]["max"], 1), "noisy_p50": round(r["noisy"]["p50"])}
runs = {"A": [], "B": []}
for i in range(pairs):
    for name in (("A", "B") if i % 2 == 0 else ("B", "A")):
        res = one(env_a if name == "A" else env_b); runs[name].append(res)
        print(json.dumps({"run": name, **res}), flush=True)
for name, rs in runs.items():
    print(json.dumps({"median": name, "n": len(rs), **{k: statistics.median(r[k] for r in rs) for k in rs[0]}}), flush=True)
