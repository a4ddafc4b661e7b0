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


def test_the_bench_consumer_process_runs_and_counts_its_visits(tmp_path: Path) -> None:
    """``python -m bench.quickrun`` (every quick consumer process of the benchmarks) starts,
    runs an item and reports its one-transaction visits: its visit counter wraps the
    top-level queue's own ``run_visit``, and a move of that code broke the process (twice)."""
    import os
    import subprocess
    import sys

    from bench.quickrun import JOB, open_quick

    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = open_quick(url)
    q.enqueue(JOB, {"t": "t", "e": 0.0, "d": 0.0}, app="b", tenant="t")
    q.close()
    done = tmp_path / "done.json"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "BENCH_OUT": str(tmp_path / "out.txt"), "PYTHONPATH": str(repo)}
    config = json.dumps({"one_transaction_visits": True, "idle_sleep_s": 0.005})
    args = ["--config", config, "--expect", "1", "--seconds", "30", "--done", str(done)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.quickrun", url, *args],
        cwd=repo,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    report = json.loads(done.read_text())
    assert report["stats"]["completed"] == 1
    assert report["one_transaction_visits"]["committed"] >= 1


def test_a_probe_overrides_the_profile_and_the_consumer_process_by_argument(
    tmp_path: Path,
) -> None:
    """The results folders' probes run the peer workloads with a changed profile or their
    own consumer process, passed in (they each patched the module before)."""
    seen: list[tuple[str, str]] = []

    def consumer(url: str, config_json: str) -> list[str]:
        seen.append((url, config_json))
        return ["my-consumer", url, config_json]

    peer = QuickPeer(tmp_path, "sqlite", overrides={"dequeue_max": 3}, consumer=consumer)
    try:
        cmd = peer.worker_cmd()
        assert cmd[0] == "my-consumer" and json.loads(cmd[2])["dequeue_max"] == 3
        assert json.loads(cmd[2])["visits_per_transaction"] == 16  # the rest of the profile
        assert "dequeue_max=3" in peer.config
        peer.throughput = True
        assert json.loads(peer.worker_cmd()[2])["dequeue_max"] == 3
    finally:
        peer.close()
    (tmp_path / "plain").mkdir()
    plain = QuickPeer(tmp_path / "plain", "sqlite")
    try:
        assert plain.worker_cmd()[1:3] == ["-m", "bench.quickrun"]
    finally:
        plain.close()
