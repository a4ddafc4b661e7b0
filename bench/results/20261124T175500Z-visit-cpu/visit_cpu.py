"""CPU of one batched visit (the noisy-neighbour shape, quiet and single-threaded): a
noisy zone with a backlog plus ``small`` zones holding one item each, visited together
by Manager.visit_many as the running consumer does (timer lookahead on), on sqlite.
Prints the median and p90 thread CPU per visit over ``rounds`` visits.

    PYTHONPATH=. python bench/results/20261124T175500Z-visit-cpu/visit_cpu.py [small] [rounds]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time

from bench.peers.quick_peer import peer_config
from quickzones.client import Quick


def main(small: int = 3, rounds: int = 300) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        q = Quick.open(f"sqlite:///{d}/q.db")

        @q.job("noop")
        def noop(payload: object, ctx: object) -> None:
            return None

        q.enqueue_many("noop", [{}] * (rounds * 8 + 100), app="b", tenant="noisy")
        c = q.consumer(peer_config(False))
        mgr, horizon = c.manager, c.scanner.lookahead_ms
        cpu: list[float] = []
        items: list[int] = []
        for r in range(rounds):
            for i in range(small):
                q.enqueue("noop", {}, app="b", tenant=f"t{r}-{i}")
            refs = c.scan_once()
            t0 = time.thread_time()
            works = mgr.visit_many(refs, None, horizon_ms=horizon)
            cpu.append((time.thread_time() - t0) * 1000)
            items.append(len(works))
            for w in works:
                c.execute(w)
            c.flush_completions()
        q.close()
    cpu.sort()
    return {
        "small_zones": small,
        "cpu_ms_p50": statistics.median(cpu),
        "cpu_ms_p90": cpu[int(len(cpu) * 0.9)],
        "items_mean": statistics.fmean(items),
    }


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    print(json.dumps(main(*args)))
