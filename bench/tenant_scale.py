"""Tenant scale (issue 43 point 4): what a million other tenants cost, side by side with a
store that has none, in one run.

    python -m bench.tenant_scale [--tenants 1000000] [--settings 100000] [--store sqlite]
        [--runs 5] [--many 100000] [--many-runs 3] [--many-on big] [--requests 50]
        [--out DIR] [--build store|consumer]

The big store (:mod:`bench.tenant_store`, built through the store functions a consumer
calls, or ``--build consumer`` by a consumer: the same store): app ``a``'s ``--tenants``
tenants each had one item once (their zones are empty now, their pointers collected, the
item a dead letter: as many dead letters as tenants), and ``--settings`` of them a
weight, a tenant limit or a pause (a third each). The baseline: a store built the same
way with no tenants. Cases:

1. app ``b``'s drain (:func:`bench.settings_scale.drain`: 50 tenants x 40 items,
   ``run_until_idle`` in this process): items/s, CPU ms an item (this process's), store
   reads and keys read (exact);
2. app ``b``'s noisy neighbour as ``quick worker --workers 4`` runs it
   (:func:`bench.noisy_pickup.one_run`: 100 small tenants x 10 items over 5 s beside one
   tenant's 1,000-item burst, jobs sleep 5 ms): small tenants' p50/p99, and the worker
   process's CPU ms an item from its warm-up item to its last (idle polls included);
3. ``--many`` tenants of app ``b`` with one item each, drained by ``quick worker
   --workers 4`` (:func:`bench.lone_tenant.user_rate`), against one tenant with as many
   items: items/s and the worker's CPU s per 1,000 items, each on a fresh copy of the
   store (``--many-on``: the big store, or both);
4. ``quick serve``'s pages (:mod:`bench.tenant_pages`), ``--requests`` each: p50/p99 and
   the server's RSS growth.

The host is shared and its load moves a run's wall rate by more than the targets' 10 %,
so the comparisons are paired: every copy of a store is written to disk and read through
once (a fresh copy's first run otherwise pays the copy's writeback and a cold cache), each
store has one unmeasured drain, then cases 1 and 2 run in ``--runs`` pairs, the stores
alternating (none, a million, a million, none, ...; case 2 in each pair in the other order
from case 1), and case 3 in ``--many-runs`` pairs of many and lone, alternating the same
way. A ratio is the median of the pairs' ratios (each pair ran seconds apart, under the
same load), reported beside the stores' medians and the same ratio of CPU an item, which
the host's load moves least.

Targets: (1) and (2) on the big store within 10 % of the baseline's (drain rate at least
0.9x, small p99 at most 1.1x); (4) every page's p99 under 100 ms and RSS growth under
50 MB on the big store; (3) the many tenants at least half the lone tenant's rate.
Results: ``bench/results/<UTC timestamp>-tenant-scale/tenant_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from bench import lone_tenant, noisy_pickup, settings_scale, tenant_pages, tenant_store
from bench.common import count_lines, log, machine, run_folder, summary
from bench.peers.base import Peer

STORES = ("empty", "big")
NOISY = ("small_p50", "small_p99", "small_max", "noisy_p50", "burst_s", "noisy_cpu_ms_per_item")
DRAIN = ("items_per_s", "cpu_ms_per_item", "reads", "keys_read")
KINDS = ("many", "lone")


def pair_order(pair: int, names: Sequence[str]) -> list[str]:
    """Pair ``pair``'s order: as given for even pairs, reversed for odd ones (a, b, b, a,
    ...), so neither side always runs first, just after the other's run."""
    return list(names) if pair % 2 == 0 else list(names)[::-1]


def paired(base: Sequence[float], other: Sequence[float]) -> dict[str, Any]:
    """``other`` against ``base``, run i of one paired with run i of the other: both
    medians, each pair's ratio other / base and the median of those ratios (the figure a
    target reads: a pair ran under one load, two medians over many)."""
    # A base of 0 (a count that saw nothing in a tiny run on a loaded host, as in a CI run
    # of tests/unit/test_bench_tenant_scale.py) has no ratio: NaN, left out of the median.
    ratios = [o / b if b else float("nan") for b, o in zip(base, other, strict=True)]
    defined = [r for r in ratios if r == r]
    return {
        "base_median": statistics.median(base) if base else float("nan"),
        "other_median": statistics.median(other) if other else float("nan"),
        "pair_ratios": ratios,
        "ratio": statistics.median(defined) if defined else float("nan"),
    }


def _warm(path: Path) -> None:
    """Have ``path``'s pages written and in the page cache before any measured run: a
    fresh copy's dirty pages would be written back during the first run, and a file
    not read yet read from disk by it."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        while f.read(1 << 20):
            pass


def _copy(path: Path, folder: Path, name: str) -> str:
    url = tenant_store.copy_to(path, folder, name)
    _warm(folder / name)
    return url


def _drain_b(url: str) -> dict[str, float]:
    d = settings_scale.drain(url, lambda q: None, 50, 40)
    if d.ran != 50 * 40:
        raise RuntimeError(f"app b's drain ran {d.ran} of {50 * 40} items")
    return {
        "items_per_s": d.ran / d.seconds,
        "cpu_ms_per_item": d.cpu_s * 1000 / d.ran,
        "reads": d.reads,
        "keys_read": d.keys,
        "seconds": d.seconds,
    }


def _cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return float("nan")
    return float(t.user + t.system)


def _noisy_user(store: str, cpu: dict[str, float]) -> Callable[[Path, int], Peer]:
    """:func:`bench.noisy_pickup.quick_user` on ``store``, its worker process's CPU
    seconds and items from the warm-up item's start to the run's end put in ``cpu``."""

    def make(workdir: Path, workers: int) -> Peer:
        peer = noisy_pickup.quick_user(workdir, workers, store=store)
        ready, stop = peer.wait_ready, peer.stop_worker

        def wait_ready(timeout_s: float = 60.0) -> None:
            ready(timeout_s)
            if peer.proc is not None:
                cpu["start"] = _cpu_s(peer.proc.pid)

        def stop_worker() -> None:
            if peer.proc is not None and "start" in cpu:
                cpu["cpu_s"] = _cpu_s(peer.proc.pid) - cpu.pop("start")
                cpu["items"] = count_lines(peer.out) - 1  # the warm-up item not counted
            stop()

        peer.wait_ready = wait_ready  # type: ignore[method-assign]
        peer.stop_worker = stop_worker  # type: ignore[method-assign]
        return peer

    return make


def _noisy(url: str, window_s: float) -> dict[str, float]:
    cpu: dict[str, float] = {}
    one = noisy_pickup.one_run(_noisy_user(url, cpu), window_s=window_s)
    one["noisy_cpu_ms_per_item"] = cpu["cpu_s"] * 1000 / max(1.0, cpu["items"])
    return one


def _many(path: Path, work: Path, n: int, spread: bool) -> tuple[float, float]:
    """``quick worker``'s rate over n items in n tenants (spread) or one, on a fresh warm
    copy, and its CPU seconds per 1,000 items."""
    work.mkdir()
    url = _copy(path, work, "q.db")
    rate = lone_tenant.user_rate(url, n, work, spread=spread)
    cpu = lone_tenant.last_cpu.get("per_1000", float("nan"))
    (work / "q.db").unlink()
    return rate, cpu


def _targets(res: dict[str, Any]) -> dict[str, Any]:
    c, pages = res["compared"], res["pages"]
    drain, p99 = c["drain_items_per_s"], c["small_p99"]
    out: dict[str, Any] = {
        "drain_rate_big_over_empty": {
            "ratio": drain["ratio"],
            "met": drain["ratio"] >= 0.9,
            "cpu_ms_per_item_ratio": c["drain_cpu_ms_per_item"]["ratio"],
        },
        "small_p99_big_over_empty": {
            "ratio": p99["ratio"],
            "met": p99["ratio"] <= 1.1,
            "worker_cpu_ms_per_item_ratio": c["noisy_cpu_ms_per_item"]["ratio"],
        },
        "pages_p99_under_100ms": {
            "worst_ms": pages["big"]["worst_p99_ms"],
            "met": pages["big"]["worst_p99_ms"] < 100,
            "over": sorted(p for p, v in pages["big"]["pages"].items() if v["p99"] >= 100),
        },
        "rss_growth_under_50mb": {
            "mb": pages["big"]["rss_growth_mb"],
            "met": pages["big"]["rss_growth_mb"] < 50,
        },
    }
    if "big" in res["many_compared"]:
        m = res["many_compared"]["big"]
        ratio = m["rate"]["ratio"]
        cpu = m["cpu_s_per_1000"]["ratio"]
        out["many_tenants_at_least_half_lone"] = {
            "ratio": ratio,
            "met": ratio >= 0.5,
            # The lone tenant's CPU an item over the many's: the rate ratio were the
            # worker bound by its own CPU alone. None measured (a tiny run's CPU reading
            # of 0 on a loaded host, as in a CI run of tests/unit/test_bench_tenant_scale.py):
            # no ratio, NaN, as paired() gives.
            "cpu_ratio": 1 / cpu if cpu else float("nan"),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tenant_scale")
    ap.add_argument("--tenants", type=int, default=1_000_000)
    ap.add_argument("--settings", type=int, default=100_000)
    ap.add_argument("--store", choices=["sqlite"], default="sqlite")
    ap.add_argument("--runs", type=int, default=5, help="pairs of runs of cases 1 and 2")
    ap.add_argument("--many", type=int, default=100_000, help="case 3's items (0: skip it)")
    ap.add_argument("--many-runs", type=int, default=3, help="pairs of case 3's runs")
    ap.add_argument(
        "--many-on",
        choices=["big", "both"],
        default="big",
        help="case 3 on the big store, or on both (twice the time)",
    )
    ap.add_argument("--requests", type=int, default=50, help="requests of each page")
    ap.add_argument(
        "--page-budget", type=float, default=60.0, help="seconds of requests a page may take"
    )
    ap.add_argument("--noisy-window", type=float, default=5.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help="results directory")
    ap.add_argument("--cache", default=str(tenant_store.CACHE), help="where built stores are kept")
    ap.add_argument(
        "--build",
        choices=tenant_store.THROUGH,
        default="store",
        help="how a store not in the cache is built (the same store either way)",
    )
    args = ap.parse_args(argv)
    if args.settings > args.tenants:
        ap.error("--settings must be at most --tenants")
    files: dict[str, Path] = {}
    built: dict[str, Any] = {}
    for name, tenants, settings in (("empty", 0, 0), ("big", args.tenants, args.settings)):
        files[name], built[name] = tenant_store.cached(
            tenants, settings, Path(args.cache), args.build
        )
        log(f"tenant scale: {name} store {files[name].name} {built[name]}")
    out = run_folder("tenant-scale", args.out)
    per_run: dict[str, list[dict[str, float]]] = {name: [] for name in STORES}
    sequence: list[str] = []  # what ran, in order: "drain empty", "noisy big", ...
    loads: list[float] = []  # the host's 1-minute load average as each pair started
    many_on = STORES if args.many_on == "both" else ("big",)
    many: dict[str, dict[str, list[tuple[float, float]]]] = {
        n: {k: [] for k in KINDS} for n in many_on
    }
    pages: dict[str, Any] = {}

    def report() -> None:
        """Summarise what has run and write it: after the pages, and again after case 3
        (a long one: what ran before it is kept if it is stopped)."""
        fields = [f"drain_{k}" for k in DRAIN] + list(NOISY)
        sums = {n: {f: summary([run[f] for run in per_run[n]]) for f in fields} for n in STORES}
        compared = {
            f: paired([run[f] for run in per_run["empty"]], [run[f] for run in per_run["big"]])
            for f in fields
        }
        many_compared: dict[str, Any] = {}
        for name, kinds in many.items():
            if not kinds["many"]:
                continue
            for kind in KINDS:
                sums[name][f"{kind}_items_per_s"] = summary([rate for rate, _ in kinds[kind]])
                sums[name][f"{kind}_cpu_s_per_1000"] = summary([cpu for _, cpu in kinds[kind]])
            lone, spread = kinds["lone"], kinds["many"]
            many_compared[name] = {
                "rate": paired([r for r, _ in lone], [r for r, _ in spread]),
                "cpu_s_per_1000": paired([c for _, c in lone], [c for _, c in spread]),
            }
            sums[name]["many_over_lone"] = summary(many_compared[name]["rate"]["pair_ratios"])
        res: dict[str, Any] = {
            "command": "python -m bench.tenant_scale " + " ".join(argv or sys.argv[1:]),
            "tenants": args.tenants,
            "settings": args.settings,
            "dead_letters": args.tenants,
            "many": args.many,
            "stores": built,
            "machine": machine(),
            "summary": sums,
            "compared": compared,  # base: the empty store, other: the big one
            "many_compared": many_compared,  # base: the lone tenant, other: the many
            "pages": pages,
            "per_run": per_run,
            "many_runs": many,
            "sequence": sequence,
            "loads": loads,  # cases 1-2's pairs, then case 3's
        }
        res["targets"] = _targets(res)
        (out / "tenant_scale.json").write_text(json.dumps(res, indent=1))
        for f in (
            "drain_items_per_s",
            "drain_cpu_ms_per_item",
            "small_p99",
            "noisy_cpu_ms_per_item",
        ):
            c = compared[f]
            pairs = ", ".join(f"{x:.2f}" for x in c["pair_ratios"])
            log(
                f"{f}: empty {c['base_median']:.3f}, big {c['other_median']:.3f}, big / empty "
                f"by pair {pairs}: median {c['ratio']:.3f}"
            )
        for target, v in res["targets"].items():
            shown = {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items()}
            log(f"target {target}: {'met' if v['met'] else 'NOT met'} {shown}")
        log(f"results in {out}")

    with tempfile.TemporaryDirectory(prefix="bench-tenant-scale-") as tmp:
        urls = {n: _copy(files[n], Path(tmp), f"{n}.db") for n in STORES}
        for name in STORES:  # unmeasured: whatever a first drain on a file pays
            warm = _drain_b(urls[name])
            log(f"tenant scale warm-up {name}: app b's drain {warm['items_per_s']:.0f} items/s")
        for r in range(args.runs):
            runs: dict[str, dict[str, float]] = {name: {} for name in STORES}
            loads.append(os.getloadavg()[0])
            for name in pair_order(r, STORES):
                runs[name].update({f"drain_{k}": v for k, v in _drain_b(urls[name]).items()})
                sequence.append(f"drain {name}")
            for name in pair_order(r + 1, STORES):
                runs[name].update(_noisy(urls[name], args.noisy_window))
                sequence.append(f"noisy {name}")
            for name in STORES:
                one = runs[name]
                per_run[name].append(one)
                log(
                    f"tenant scale pair {r + 1}/{args.runs} (load {loads[-1]:.1f}) {name}: "
                    f"app b's drain "
                    f"{one['drain_items_per_s']:.0f} items/s, {one['drain_cpu_ms_per_item']:.3f}"
                    f" CPU ms an item ({one['drain_keys_read']:.0f} keys read); noisy neighbour "
                    f"small p50 {one['small_p50']:.1f} p99 {one['small_p99']:.1f} ms, worker "
                    f"{one['noisy_cpu_ms_per_item']:.3f} CPU ms an item"
                )
        for name in STORES:
            pages[name] = tenant_pages.measure(
                urls[name], args.requests, Path(tmp) / "serve.log", args.page_budget
            )
            log(
                f"tenant scale {name}: worst page p99 {pages[name]['worst_p99_ms']:.0f} ms, "
                f"serve RSS +{pages[name]['rss_growth_mb']:.1f} MB"
            )
        if args.many and args.many_runs:
            report()
        for r in range(args.many_runs if args.many else 0):
            loads.append(os.getloadavg()[0])
            for name in many_on:
                for kind in pair_order(r, KINDS):
                    work = Path(tmp) / f"{kind}-{name}-{r}"
                    rate, cpu = _many(files[name], work, args.many, spread=kind == "many")
                    many[name][kind].append((rate, cpu))
                    sequence.append(f"{kind} {name}")
                    log(
                        f"tenant scale pair {r + 1}/{args.many_runs} {name}: {args.many:,} "
                        f"items, {kind}: {rate:.0f} items/s, {cpu:.3f} CPU s per 1,000 items"
                    )
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
