"""One noisy-neighbour run (peer workload ii, sqlite, quick's peer fairness profile) with
the fewest-held-first ordering on ("held") or off ("noheld"). One JSON line, then the
consumer's context switches per thread.

PYTHONPATH=. python bench/results/20261124T123000Z-fewest-held/ab.py held|noheld ['{overrides}']
"""

import json
import os
import sys
import tempfile
from pathlib import Path

from bench import peer_workloads as w
from bench.peers.quick_peer import run_on_sqlite

HERE = Path(__file__).resolve().parent
variant = sys.argv[1]
extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
if variant == "noheld":
    os.environ["NOHELD"] = "1"  # read by runner.py, the consumer process
ctx = tempfile.mktemp(suffix=".json")
os.environ["CTXOUT"] = ctx
r = run_on_sqlite(
    lambda peer: w.noisy_neighbour(peer, 10, 5.0, 5.0),
    overrides=extra,
    consumer=lambda url, config: [sys.executable, str(HERE / "runner.py"), url, config],
)
print(json.dumps({
    "variant": variant, "extra": extra, "small_p50": r["small"]["p50"],
    "small_p99": r["small"]["p99"], "small_max": r["small"]["max"],
    "noisy_p50": r["noisy"]["p50"], "ran": r["ran"], "expected": r["expected"],
}))
print(open(ctx).read())
os.unlink(ctx)
