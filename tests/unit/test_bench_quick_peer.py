"""quick's own peer in the peer benchmarks (bench/peers/quick_peer.py): the consumer
process it starts for the fairness workloads (noisy neighbour, delayed) commits each zone
visit once, up to 16 zones per transaction on one manager, and the report says so."""

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
        assert _worker_config(peer)["visits_per_transaction"] == 16
        assert _worker_config(peer)["managers"] == 1
        assert "managers=1" in peer.config
        assert "one_transaction_visits=True visits_per_transaction=16" in peer.config
        peer.throughput = True  # workload (i) keeps the paper's three transactions
        assert _worker_config(peer)["one_transaction_visits"] is False
        assert _worker_config(peer)["visits_per_transaction"] == 1
        assert _worker_config(peer)["managers"] == 4
    finally:
        peer.close()
