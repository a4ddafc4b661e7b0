"""Command line of the simulation: run seeds, report failures with their replay command."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from quickzones.testing.simulation.harness import run_seed
from quickzones.testing.simulation.model import SimResult

DEFAULT_FAULTS = 0.01


def replay_command(seed: int, steps: int, faults: float) -> str:
    cmd = f"python -m quickzones.testing.simulation --seed {seed} --steps {steps}"
    if faults != DEFAULT_FAULTS:
        cmd += f" --faults {faults}"
    return cmd


def _run(args: tuple[int, int, float]) -> SimResult:
    seed, steps, faults = args
    return run_seed(seed, steps, faults)


def run_seeds(
    seeds: Iterable[int], steps: int, faults: float, *, jobs: int = 1
) -> Iterator[SimResult]:
    """Results in seed order; ``jobs`` > 1 spreads seeds over processes (each run is
    single-threaded and self-contained, so processes change nothing but wall time)."""
    work = [(s, steps, faults) for s in seeds]
    if jobs <= 1:
        for w in work:
            yield _run(w)
        return
    with ProcessPoolExecutor(jobs) as pool:
        yield from pool.map(_run, work, chunksize=4)


def summarize(results: Sequence[SimResult], steps: int, elapsed_s: float) -> str:
    faults: dict[str, int] = {}
    for r in results:
        for kind, n in r.fault_counts.items():
            faults[kind] = faults.get(kind, 0) + n
    fault_text = " ".join(f"{k}={v}" for k, v in faults.items())
    failed = sum(1 for r in results if not r.ok)
    return (
        f"{len(results)} seeds x {steps} steps in {elapsed_s:.1f}s: "
        f"{failed} failed; faults {fault_text}; "
        f"items enqueued={sum(r.enqueued for r in results)} "
        f"completed={sum(r.completed for r in results)} "
        f"dead_lettered={sum(r.dead_lettered for r in results)} "
        f"lost={sum(r.lost for r in results)}; "
        f"aborted user txns={sum(r.aborted_txns for r in results)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quickzones.testing.simulation",
        description="Deterministic simulation of quick over the fault-injecting MemoryStore.",
    )
    parser.add_argument("--seeds", type=int, default=10, help="run seeds 0..N-1")
    parser.add_argument("--seed", type=int, default=None, help="run just this seed")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--faults", type=float, default=DEFAULT_FAULTS, help="probability of each fault kind"
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes to spread seeds over")
    parser.add_argument("--verbose", action="store_true", help="print every violation")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(args.seeds))
    started = time.monotonic()
    results: list[SimResult] = []
    for r in run_seeds(seeds, args.steps, args.faults, jobs=args.jobs):
        results.append(r)
        if r.ok:
            continue
        print(f"seed {r.seed}: FAILED with {len(r.violations)} violation(s)")
        shown = r.violations if args.verbose else r.violations[:5]
        for v in shown:
            print(f"  {v}")
        if len(shown) < len(r.violations):
            print(f"  ... {len(r.violations) - len(shown)} more (--verbose)")
        print(f"  replay: {replay_command(r.seed, args.steps, args.faults)}")
    if args.seed is not None:
        # Two runs of one seed print the same hash: the replay is the same run.
        print(f"seed {args.seed} trace {results[0].trace_hash}")
    print(summarize(results, args.steps, time.monotonic() - started))
    return 0 if all(r.ok for r in results) else 1
