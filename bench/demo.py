"""``quick demo`` as a user runs it, repeated, against the figures it is known for: the
small tenants' p99 at most 10 ms and the producers keeping their rate (at least 13,000
items in its 20 s; issue 40 point 9).

``python -m bench.demo [--runs 5] [--baseline PYTHON] [--pin CPU] [--realtime] [--check]
[--out DIR] [-- DEMO ARGS]``

Each run is a fresh ``python -m quickzones demo`` process with the demo's defaults (or
DEMO ARGS), read from the summary line it prints, so the same bench measures any tree:
``--baseline`` names another checkout's interpreter (a worktree of an older commit with
its own virtualenv) whose demo runs alternately with this one, A then B then A, so a busy
stretch of a shared host falls on both and the pairwise differences say what the code
changed. Per run: items enqueued and run, the small tenants' p50 and p99, the worst small
tenant's p99/p50, the child's CPU seconds and CPU ms per item, and the host's load
average before it started (the demo is one Python process: on a loaded host its
producers fall behind and its tail grows whatever the code, so a figure from a busy host
is marked ``quiet: false`` and is no verdict on the code). A run's p99 is its twentieth
slowest small pickup, so runs scatter by a few ms: where a tree's demo writes every pickup
(``quick demo --pickups``), its runs' small pickups are also pooled into one sample
(``pooled_small_ms``: p50, p95, p98, p99, p99.5), which compares two trees' tails better.

``--warm-cpus`` runs each demo a second time with every allowed CPU kept out of its idle
state by a busy loop at ``SCHED_IDLE`` priority (one pinned process a CPU: it gets only the
time no other thread wants, so the demo's threads never wait for it), reported as
``this (CPUs kept busy)`` beside ``this``: what waking an idle CPU costs the demo on this
host. On the Firecracker guests of these sessions an idle vCPU halts, and a thread woken
there runs with cold caches: a paced enqueue costs twice the CPU of one made back to back
(docs/performance.md, "Waking an idle CPU"); the pairs say how much of a tail is that.
The busy loops count in the load average the quiet verdict reads: judge the figures
against the targets (``--check``) from a sitting without it.

``--pin CPU`` runs every demo on that one CPU (``taskset``-like affinity) and
``--realtime`` at SCHED_FIFO priority: on a shared 2-core host, ``--pin 1 --realtime`` was
the one setting where both trees gave the full rate run after run (issue 40 point 9,
docs/performance.md); spread over both cores the demo's threads contend for the GIL, and
its figures then measure the scheduler more than the code.

Results: ``bench/results/<UTC timestamp>-demo/demo.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from bench.common import log, summary, write_run
from quickzones.testing.provision.process import die_with_parent

TARGET_ITEMS = 13_000  # the producers keep their rate: 20 s x (20 x 5 + 500)/s + 1,500
TARGET_SMALL_P99_MS = 10.0
WARM = "this (CPUs kept busy)"  # --warm-cpus: this tree, no CPU left to idle
QUIET_LOAD_PER_CPU = 0.5  # a 1-minute load average under this share of the CPUs: quiet

# The demo's closing line (quick_core/cli/demo.py; the same text since af6155e):
# "13565/13565 items run in 20.3s; small tenants overall p50 3.1 ms, p99 9.6 ms; worst
# small-tenant p99/p50 4.2". Rich wraps it on a narrow console; the child gets a wide one.
SUMMARY = re.compile(
    r"(?P<run>\d+)/(?P<enqueued>\d+) items run in (?P<elapsed>[\d.]+)s; small tenants "
    r"overall p50 (?P<p50>[\d.]+|nan) ms, p99 (?P<p99>[\d.]+|nan) ms; worst small-tenant "
    r"p99/p50 (?P<ratio>[\d.]+)"
)


class DemoOutputUnreadable(RuntimeError):
    """The demo printed no summary line this bench can read: a changed demo must fail the
    bench, never yield a figure read from the wrong place."""


@dataclass(frozen=True, slots=True)
class DemoRun:
    enqueued: int
    run: int
    elapsed_s: float
    small_p50_ms: float
    small_p99_ms: float
    worst_ratio: float
    cpu_s: float = float("nan")
    load_before: float = float("nan")
    # Every small tenant's pickup (ms), from ``quick demo --pickups`` (empty: a tree whose
    # demo has no such option).
    small_pickups: tuple[float, ...] = ()

    @property
    def cpu_ms_per_item(self) -> float:
        return self.cpu_s * 1000 / max(self.run, 1)


def parse_summary(output: str) -> DemoRun:
    """The demo's closing line as figures (whitespace and wrapping tolerated)."""
    found = SUMMARY.search(" ".join(output.split()))
    if found is None:
        raise DemoOutputUnreadable(f"no summary line in the demo's output: {output[-500:]!r}")
    return DemoRun(
        enqueued=int(found["enqueued"]),
        run=int(found["run"]),
        elapsed_s=float(found["elapsed"]),
        small_p50_ms=float(found["p50"]),
        small_p99_ms=float(found["p99"]),
        worst_ratio=float(found["ratio"]),
    )


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _placement(pin: int | None, realtime: bool) -> Callable[[], None] | None:
    """What the child does before it execs: keep to one CPU, and/or run at real-time
    priority (SCHED_FIFO; needs root or CAP_SYS_NICE) so other processes on a shared host
    cannot preempt it."""
    if pin is None and not realtime:
        return None

    def place() -> None:
        if pin is not None:
            os.sched_setaffinity(0, {pin})
        if realtime:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))

    return place


# A busy loop that runs only when its CPU would otherwise idle, and dies with the bench:
# started with ``die_with_parent`` (the kernel kills it when its parent ends), even a bench
# killed outright, whose ``finally`` never runs (an orphaned loop at SCHED_IDLE on a busy
# host gets no CPU to notice for itself).
_SPIN = (
    "import os, sys\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    sys.exit()\n"  # the bench ended before the kernel was asked
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "while True:\n"
    "    pass\n"
)


@contextlib.contextmanager
def cpus_kept_busy(cpus: set[int] | None = None) -> Iterator[list[int]]:
    """Keep each of ``cpus`` (default: every CPU this process may use) from idling while
    the block runs: one ``SCHED_IDLE`` busy loop pinned to each. Yields the CPUs."""
    chosen = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    me = str(os.getpid())
    procs = [
        subprocess.Popen([sys.executable, "-c", _SPIN, str(cpu), me], preexec_fn=die_with_parent)
        for cpu in chosen
    ]
    try:
        yield chosen
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def one_run(
    python: str,
    demo_args: list[str],
    pin: int | None = None,
    realtime: bool = False,
    warm_cpus: bool = False,
) -> DemoRun:
    """One ``python -m quickzones demo`` in a fresh process; its CPU time from the
    kernel's accounting of the finished child."""
    env = {**os.environ, "COLUMNS": "240", "TERM": "dumb"}
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        pickups = os.path.join(tmp, "pickups.json")
        asked = ["--pickups", pickups] if writes_pickups(python) else []
        with cpus_kept_busy() if warm_cpus else contextlib.nullcontext():
            # The spinners are children too, but waited for after ``after``: not counted.
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run(
                [python, "-m", "quickzones", "demo", *demo_args, *asked],
                env=env,
                capture_output=True,
                text=True,
                preexec_fn=_placement(pin, realtime),
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        small: tuple[float, ...] = ()
        if asked and os.path.exists(pickups):
            with open(pickups, encoding="utf-8") as f:
                small = tuple(json.load(f)["small"])
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "items run in" not in out:
        raise DemoOutputUnreadable(f"the demo exited {proc.returncode}: {out[-500:]!r}")
    r = parse_summary(out)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return replace(r, cpu_s=round(cpu, 2), load_before=load, small_pickups=small)


@functools.cache
def writes_pickups(python: str) -> bool:
    """Whether that interpreter's ``quick demo`` has ``--pickups`` (older trees do not)."""
    proc = subprocess.run(
        [python, "-m", "quickzones", "demo", "--help"], capture_output=True, text=True
    )
    return "--pickups" in proc.stdout


POOLED_QUANTILES = (0.5, 0.95, 0.98, 0.99, 0.995)


def pooled(runs: list[DemoRun]) -> dict[str, Any] | None:
    """The small tenants' pickups of all ``runs`` as one sample: its quantiles (None
    unless every run wrote them)."""
    if not runs or not all(r.small_pickups for r in runs):
        return None
    values = sorted(x for r in runs for x in r.small_pickups)
    top = len(values) - 1
    out: dict[str, Any] = {"pickups": len(values)}
    for q in POOLED_QUANTILES:
        out[f"p{q * 100:g}"] = values[min(top, round(q * top))]
    return out


def verdict(runs: list[DemoRun]) -> dict[str, Any]:
    """The medians against the demo's figures, and whether the host was quiet enough for
    them to say anything about the code."""
    items = summary([float(r.enqueued) for r in runs])["median"]
    p99 = summary([r.small_p99_ms for r in runs])["median"]
    load = max((r.load_before for r in runs), default=float("nan"))
    return {
        "items_at_least": TARGET_ITEMS,
        "small_p99_ms_at_most": TARGET_SMALL_P99_MS,
        "items_met": items >= TARGET_ITEMS,
        "small_p99_met": p99 <= TARGET_SMALL_P99_MS,
        "quiet": load < QUIET_LOAD_PER_CPU * (os.cpu_count() or 1),
        "highest_load_before_a_run": load,
    }


def figures(runs: list[DemoRun]) -> dict[str, Any]:
    return {
        "items": summary([float(r.enqueued) for r in runs]),
        "small_p50_ms": summary([r.small_p50_ms for r in runs]),
        "small_p99_ms": summary([r.small_p99_ms for r in runs]),
        "worst_ratio": summary([r.worst_ratio for r in runs]),
        "cpu_ms_per_item": summary([round(r.cpu_ms_per_item, 3) for r in runs]),
        "pooled_small_ms": pooled(runs),
        "verdict": verdict(runs),
        "per_run": [
            {**_without_pickups(r), "cpu_ms_per_item": round(r.cpu_ms_per_item, 3)} for r in runs
        ],
    }


def _without_pickups(r: DemoRun) -> dict[str, Any]:
    row = asdict(r)
    del row["small_pickups"]
    return row


def _describe(name: str, r: DemoRun) -> str:
    return (
        f"{name}: {r.run}/{r.enqueued} items, small p50 {r.small_p50_ms:.1f} p99 "
        f"{r.small_p99_ms:.1f} ms, {r.cpu_ms_per_item:.2f} CPU ms/item, load {r.load_before:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--baseline",
        default=None,
        help="another tree's python (its own virtualenv): its demo runs alternately with this one",
    )
    ap.add_argument("--pin", type=int, default=None, help="run each demo on this one CPU")
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="run each demo at SCHED_FIFO priority (root; with --pin, one core stays for the rest)",
    )
    ap.add_argument(
        "--warm-cpus",
        action="store_true",
        help="also run each demo with every CPU kept from idling (SCHED_IDLE busy loops): "
        "what waking an idle CPU costs, side by side",
    )
    ap.add_argument("--out", default="", help="results directory")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when this tree misses a figure on a quiet host, or does worse than "
        "--baseline on any host",
    )
    ap.add_argument("demo_args", nargs="*", help="passed to quick demo (after --)")
    args = ap.parse_args(argv)
    systems = {"this": sys.executable}
    if args.baseline:
        systems["baseline"] = args.baseline
    if args.warm_cpus:
        systems[WARM] = sys.executable
    runs: dict[str, list[DemoRun]] = {name: [] for name in systems}
    for i in range(args.runs):
        order = list(systems) if i % 2 == 0 else list(reversed(systems))  # each goes first
        for name in order:
            r = one_run(
                systems[name], args.demo_args, args.pin, args.realtime, warm_cpus=name == WARM
            )
            runs[name].append(r)
            log(f"demo run {i + 1}/{args.runs} " + _describe(name, r))
    res: dict[str, Any] = {
        "workload": "python -m quickzones demo " + (" ".join(args.demo_args) or "(defaults)"),
        "runs": args.runs,
        "pin": args.pin,
        "realtime": args.realtime,
        "warm_cpus": args.warm_cpus,
        "interpreters": systems,
        "summary": {name: figures(rs) for name, rs in runs.items()},
    }
    if args.baseline:
        res["pairwise_this_minus_baseline"] = {
            "small_p99_ms": [
                round(a.small_p99_ms - b.small_p99_ms, 1)
                for a, b in zip(runs["this"], runs["baseline"], strict=True)
            ],
            "items": [
                a.enqueued - b.enqueued for a, b in zip(runs["this"], runs["baseline"], strict=True)
            ],
        }
    out = write_run("demo", args.out, "python -m bench.demo " + " ".join(argv or sys.argv[1:]), res)
    for name, s in res["summary"].items():
        v = s["verdict"]
        log(
            f"{name}: median of {args.runs}: {s['items']['median']:.0f} items "
            f"({'met' if v['items_met'] else 'NOT met'}: >= {TARGET_ITEMS:,}), small p50 "
            f"{s['small_p50_ms']['median']:.1f} ms, p99 {s['small_p99_ms']['median']:.1f} ms "
            f"({'met' if v['small_p99_met'] else 'NOT met'}: <= {TARGET_SMALL_P99_MS:.0f} ms), "
            f"{s['cpu_ms_per_item']['median']:.2f} CPU ms/item"
            + (
                ""
                if s["pooled_small_ms"] is None
                else "; every small pickup pooled: "
                + ", ".join(
                    f"{k} {v:.1f} ms" for k, v in s["pooled_small_ms"].items() if k != "pickups"
                )
            )
            + (
                ""
                if v["quiet"]
                else f"; host NOT quiet (load {v['highest_load_before_a_run']:.1f})"
            )
        )
    log(f"results in {out}")
    failures = check(runs)
    for failure in failures:
        log("CHECK FAILED: " + failure)
    return 1 if args.check and failures else 0


# Worse than the baseline: a median p99 above it by more than both of these (a 20 s run's
# p99 is its 20 slowest of ~2,000 pickups, so one run's differs from the next by a few ms),
# or a median item count this far below it.
P99_WORSE_MS, P99_WORSE_RATIO, ITEMS_WORSE_RATIO = 5.0, 1.25, 0.95


def check(runs: dict[str, list[DemoRun]]) -> list[str]:
    """What ``--check`` fails on: this tree's medians against the demo's figures (only on a
    quiet host: a busy one misses them whatever the code), and against the baseline's
    medians from the same interleaved sitting (on any host)."""
    failures = []
    this = runs["this"]
    v = verdict(this)
    if v["quiet"] and not v["items_met"]:
        failures.append(f"fewer than {TARGET_ITEMS:,} items on a quiet host")
    if v["quiet"] and not v["small_p99_met"]:
        failures.append(f"small tenants' p99 above {TARGET_SMALL_P99_MS:.0f} ms on a quiet host")
    if "baseline" in runs:
        base = runs["baseline"]
        p99, base_p99 = (summary([r.small_p99_ms for r in rs])["median"] for rs in (this, base))
        if p99 > base_p99 + P99_WORSE_MS and p99 > base_p99 * P99_WORSE_RATIO:
            failures.append(
                f"small tenants' p99 {p99:.1f} ms against the baseline's {base_p99:.1f}"
            )
        items, base_items = (
            summary([float(r.enqueued) for r in rs])["median"] for rs in (this, base)
        )
        if items < base_items * ITEMS_WORSE_RATIO:
            failures.append(f"{items:.0f} items against the baseline's {base_items:.0f}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
