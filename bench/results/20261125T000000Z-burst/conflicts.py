"""Workload (ii) with the consumer's counters: one-transaction visits tried, committed and
lost to a conflict, and the consumer's event counts, beside each run's small p99.

    PYTHONPATH=. python conflicts.py RUNS
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import peer_workloads as w
from bench.peers.quick_peer import QuickPeer


def one() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        done = Path(tmp) / "done.json"

        def cmd(url: str, config: str) -> list[str]:
            return [sys.executable, "-m", "bench.quickrun", url, "--config", config,
                    "--seconds", "3600", "--done", str(done)]  # fmt: skip

        peer = QuickPeer(Path(tmp), "sqlite", consumer=cmd)
        try:
            r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
        finally:
            peer.close()
        d = json.loads(done.read_text())
    stats = d["stats"]
    keep = ("visited", "one_transaction_visit_conflict", "pointer_lease_failed", "scan")
    return {
        "p99": round(r["small"]["p99"], 1),
        "max": round(r["small"]["max"], 1),
        "burst_ms": round(r["burst_s"] * 1000),
        "one_tx": d["one_transaction_visits"],
        "lease_failed": d["lease_failed"],
        **{k: stats.get(k, 0) for k in keep},
    }


if __name__ == "__main__":
    for _ in range(int(sys.argv[1])):
        print(json.dumps(one()), flush=True)
