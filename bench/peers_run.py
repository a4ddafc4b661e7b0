"""Runs the peer workloads against quick (memory, sqlite) and RQ, Dramatiq, Celery (Redis),
procrastinate (PostgreSQL), Huey (SQLite), starting and always stopping the servers."""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import peer_workloads as w
from bench.common import log, summary
from bench.peers.base import Peer
from bench.servers import postgres_server, redis_server


def _sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "enqueue_n": 500,
            "e2e_n": 500,
            "per_small": 2,
            "window_s": 1.5,
            "work_ms": 5.0,
            "delayed_n": 40,
            "lo": 0.2,
            "hi": 1.0,
        }
    return {
        "enqueue_n": 3000,
        "e2e_n": 5000,
        "per_small": 10,
        "window_s": 5.0,
        "work_ms": 5.0,
        "delayed_n": 300,
        "lo": 0.5,
        "hi": 3.0,
    }


def _one(peer: Peer, runs: int, s: dict[str, Any]) -> dict[str, Any]:
    res: dict[str, Any] = {"config": peer.config, "batch_api": peer.batch_api}
    single, batch, e2e = [], [], []
    for r in range(runs):
        rates = w.enqueue_rates(peer, s["enqueue_n"])
        single.append(rates["single"])
        batch.append(rates["batch"])
        e2e.append(w.end_to_end(peer, s["e2e_n"]))
        log(
            f"{peer.name} run {r + 1}/{runs}: enqueue {rates['single']:.0f}/s single, "
            f"{rates['batch']:.0f}/s batch; e2e {e2e[-1]:.0f}/s"
        )
    res["enqueue_single"] = summary(single)
    res["enqueue_batch"] = summary(batch)
    res["end_to_end"] = summary(e2e)
    res["noisy"] = w.noisy_neighbour(peer, s["per_small"], s["window_s"], s["work_ms"])
    log(
        f"{peer.name} noisy: small p50 {res['noisy']['small']['p50']:.1f} "
        f"p99 {res['noisy']['small']['p99']:.1f} ms"
    )
    res["delayed"] = w.delayed(peer, s["delayed_n"], s["lo"], s["hi"])
    log(f"{peer.name} delayed: p50 {res['delayed']['p50']:.1f} p99 {res['delayed']['p99']:.1f} ms")
    return res


def _peer(module: str, cls: str) -> Any:
    """Import a peer only when it runs: a peer whose package is missing (bench/
    requirements.txt not installed) is reported as failed and the others still run."""
    import importlib

    return getattr(importlib.import_module(f"bench.peers.{module}"), cls)


def run(
    runs: int, quick: bool, backends: list[str], only_peers: list[str] | None = None
) -> dict[str, Any]:
    from bench.peers.quick_peer import QuickPeer

    s = _sizes(quick)
    out: dict[str, Any] = {"sizes": s, "runs": runs, "systems": {}}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-peers-")))
        redis_url = stack.enter_context(redis_server())
        dsn = stack.enter_context(postgres_server())
        makers: list[tuple[str, Callable[[Path], Peer]]] = [
            *[(f"quick-{b}", lambda d, b=b: QuickPeer(d, b)) for b in backends],
            ("rq", lambda d: _peer("rq_peer", "RQPeer")(d, redis_url)),
            ("dramatiq", lambda d: _peer("dramatiq_peer", "DramatiqPeer")(d, redis_url)),
            ("celery", lambda d: _peer("celery_peer", "CeleryPeer")(d, redis_url)),
            ("huey", lambda d: _peer("huey_peer", "HueyPeer")(d)),
            ("procrastinate", lambda d: _peer("procrastinate_peer", "ProcrastinatePeer")(d, dsn)),
        ]
        for name, make in makers:
            if only_peers and name not in only_peers:
                continue
            workdir = tmp / name
            workdir.mkdir()
            peer = None
            try:
                peer = make(workdir)
                out["systems"][name] = _one(peer, runs, s)
            except Exception as err:  # one broken peer must not sink the others
                log(f"{name} failed: {err}")
                traceback.print_exc()
                out["systems"][name] = {"error": repr(err)}
            finally:
                if peer is not None:
                    peer.close()
    return out
