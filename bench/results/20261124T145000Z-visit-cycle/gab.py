import json, os, sys, tempfile
from bench import peer_workloads as w
from bench.peers.quick_peer import run_on_sqlite
os.environ["GATE"] = sys.argv[1] if sys.argv[1] != "none" else ""
extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
r = run_on_sqlite(lambda peer: w.noisy_neighbour(peer, 10, 5.0, 5.0), overrides=extra,
    consumer=lambda url, config: [sys.executable, "bench/results/20261124T145000Z-visit-cycle/gate_runner.py", url, config])
print(json.dumps({"gate": sys.argv[1], "extra": extra, "p50": round(r["small"]["p50"],1), "p99": round(r["small"]["p99"],1), "max": round(r["small"]["max"],1), "noisy_p50": round(r["noisy"]["p50"]), "ran": r["ran"]}))
