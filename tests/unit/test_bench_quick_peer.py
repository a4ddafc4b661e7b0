"""quick's own peer in the peer benchmarks (bench/peers/quick_peer.py): the consumer
process it starts for the fairness workloads (noisy neighbour, delayed) commits each zone
visit once, and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

from bench.peers.quick_peer import QuickPeer


def _worker_config(peer: QuickPeer) -> dict[str, object]:
    cmd = peer.worker_cmd()
    config: dict[str, object] = json.loads(cmd[cmd.index("--config") + 1])
    return config


def test_quick_peer_fairness_workloads_run_one_transaction_visits(tmp_path: Path) -> None:
    peer = QuickPeer(tmp_path, "sqlite")
    try:
        assert _worker_config(peer)["one_transaction_visits"] is True
        assert "one_transaction_visits=True" in peer.config
        peer.throughput = True  # workload (i) keeps the paper's three transactions
        assert _worker_config(peer)["one_transaction_visits"] is False
    finally:
        peer.close()
