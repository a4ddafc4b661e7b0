import json, sys
from bench import peer_workloads as w
from bench.peers.quick_peer import run_on_sqlite
n = int(sys.argv[1]); extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
R = "/work/main/bench/results/20261124T123000Z-fewest-held/runner.py"
def cmd(url, config):
    one = f"{sys.executable} {R} '{url}' '{config}'"
    return ["sh", "-c", " & ".join([one] * n) + " & wait"]
r = run_on_sqlite(lambda peer: w.noisy_neighbour(peer, 10, 5.0, 5.0), overrides=extra, consumer=cmd)
print(json.dumps({"n": n, "extra": extra, "p50": round(r["small"]["p50"],1), "p99": round(r["small"]["p99"],1), "max": round(r["small"]["max"],1), "noisy_p50": round(r["noisy"]["p50"]), "ran": r["ran"]}))
