"""Tenant scale (issue 43 point 4): what a million other tenants cost, side by side with a
store that has none, in one run.

    python -m bench.tenant_scale [--tenants 1000000] [--settings 100000] [--store sqlite]
        [--runs 3] [--many 100000] [--requests 50] [--out DIR] [--build store|consumer]

The big store (:mod:`bench.tenant_store`, built through the store functions a consumer
calls, or ``--build consumer`` by a consumer: the same store): app ``a``'s ``--tenants``
tenants each had one item once (their zones are empty now, their pointers collected, the
item a dead letter: as many dead letters as tenants), and ``--settings`` of them a
weight, a tenant limit or a pause (a third each). The baseline: a store built the same
way with no tenants. Each case runs on both, the order alternating from run to run:

1. app ``b``'s drain (:func:`bench.settings_scale.drain`: 50 tenants x 40 items,
   ``run_until_idle``): items/s, store reads and keys read (exact);
2. app ``b``'s noisy neighbour as ``quick worker --workers 4`` runs it
   (:func:`bench.noisy_pickup.one_run`: 100 small tenants x 10 items over 5 s beside one
   tenant's 1,000-item burst, jobs sleep 5 ms): small tenants' p50/p99;
3. ``--many`` tenants of app ``b`` with one item each, drained by ``quick worker
   --workers 4`` (:func:`bench.lone_tenant.user_rate`), against one tenant with as many
   items: items/s (``--many-runs`` times, each on a fresh copy);
4. ``quick serve``'s pages (:mod:`bench.tenant_pages`), ``--requests`` each: p50/p99 and
   the server's RSS growth.

Targets: (1) and (2) on the big store within 10 % of the baseline's (drain rate at least
0.9x, small p99 at most 1.1x); (4) every page's p99 under 100 ms and RSS growth under
50 MB on the big store; (3) the many tenants at least half the lone tenant's rate.
Results: ``bench/results/<UTC timestamp>-tenant-scale/tenant_scale.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import lone_tenant, noisy_pickup, settings_scale, tenant_pages, tenant_store
from bench.common import log, machine, run_folder, summary

STORES = ("empty", "big")
NOISY = ("small_p50", "small_p99", "small_max", "noisy_p50", "burst_s")


def _drain_b(url: str) -> dict[str, float]:
    ran, reads, keys, seconds = settings_scale.drain(url, lambda q: None, 50, 40)
    if ran != 50 * 40:
        raise RuntimeError(f"app b's drain ran {ran} of {50 * 40} items")
    return {"items_per_s": ran / seconds, "reads": reads, "keys_read": keys, "seconds": seconds}


def _many(path: Path, work: Path, n: int, spread: bool) -> float:
    """``quick worker``'s rate over n items in n tenants (spread) or one, on a fresh copy."""
    work.mkdir()
    url = tenant_store.copy_to(path, work, "q.db")
    rate = lone_tenant.user_rate(url, n, work, spread=spread)
    (work / "q.db").unlink()
    return rate


def _targets(res: dict[str, Any]) -> dict[str, Any]:
    s, pages = res["summary"], res["pages"]
    drain = s["big"]["drain_items_per_s"]["median"] / s["empty"]["drain_items_per_s"]["median"]
    p99 = s["big"]["small_p99"]["median"] / s["empty"]["small_p99"]["median"]
    out: dict[str, Any] = {
        "drain_rate_big_over_empty": {"ratio": drain, "met": drain >= 0.9},
        "small_p99_big_over_empty": {"ratio": p99, "met": p99 <= 1.1},
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
    if "many_over_lone" in s["big"]:
        ratio = s["big"]["many_over_lone"]["median"]
        out["many_tenants_at_least_half_lone"] = {"ratio": ratio, "met": ratio >= 0.5}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tenant_scale")
    ap.add_argument("--tenants", type=int, default=1_000_000)
    ap.add_argument("--settings", type=int, default=100_000)
    ap.add_argument("--store", choices=["sqlite"], default="sqlite")
    ap.add_argument("--runs", type=int, default=3, help="runs of cases 1 and 2")
    ap.add_argument("--many", type=int, default=100_000, help="case 3's items (0: skip it)")
    ap.add_argument("--many-runs", type=int, default=1)
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
    many: dict[str, dict[str, list[float]]] = {n: {"many": [], "lone": []} for n in STORES}
    pages: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tenant-scale-") as tmp:
        urls = {n: tenant_store.copy_to(files[n], Path(tmp), f"{n}.db") for n in STORES}
        for r in range(args.runs):
            for name in STORES if r % 2 == 0 else STORES[::-1]:
                one = {f"drain_{k}": v for k, v in _drain_b(urls[name]).items()}
                user = functools.partial(noisy_pickup.quick_user, store=urls[name])
                one.update(noisy_pickup.one_run(user, window_s=args.noisy_window))
                per_run[name].append(one)
                log(
                    f"tenant scale run {r + 1}/{args.runs} {name}: app b's drain "
                    f"{one['drain_items_per_s']:.0f} items/s ({one['drain_keys_read']:.0f} keys "
                    f"read); noisy neighbour small p50 {one['small_p50']:.1f} p99 "
                    f"{one['small_p99']:.1f} ms"
                )
        for r in range(args.many_runs if args.many else 0):
            for name in STORES if r % 2 == 0 else STORES[::-1]:
                for kind in ("many", "lone"):
                    work = Path(tmp) / f"{kind}-{name}-{r}"
                    rate = _many(files[name], work, args.many, spread=kind == "many")
                    many[name][kind].append(rate)
                    log(f"tenant scale {name}: {args.many:,} items, {kind}: {rate:.0f} items/s")
        for name in STORES:
            pages[name] = tenant_pages.measure(
                urls[name], args.requests, Path(tmp) / "serve.log", args.page_budget
            )
            log(
                f"tenant scale {name}: worst page p99 {pages[name]['worst_p99_ms']:.0f} ms, "
                f"serve RSS +{pages[name]['rss_growth_mb']:.1f} MB"
            )
    fields = [f"drain_{k}" for k in ("items_per_s", "reads", "keys_read")] + list(NOISY)
    sums: dict[str, dict[str, Any]] = {}
    for name in STORES:
        sums[name] = {f: summary([run[f] for run in per_run[name]]) for f in fields}
        if many[name]["many"]:
            sums[name]["many_items_per_s"] = summary(many[name]["many"])
            sums[name]["lone_items_per_s"] = summary(many[name]["lone"])
            ratios = [m / lo for m, lo in zip(many[name]["many"], many[name]["lone"], strict=True)]
            sums[name]["many_over_lone"] = summary(ratios)
    res: dict[str, Any] = {
        "command": "python -m bench.tenant_scale " + " ".join(argv or sys.argv[1:]),
        "tenants": args.tenants,
        "settings": args.settings,
        "dead_letters": args.tenants,
        "many": args.many,
        "stores": built,
        "machine": machine(),
        "summary": sums,
        "pages": pages,
        "per_run": per_run,
        "many_runs": many,
    }
    res["targets"] = _targets(res)
    (out / "tenant_scale.json").write_text(json.dumps(res, indent=1))
    for target, v in res["targets"].items():
        shown = {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items()}
        log(f"target {target}: {'met' if v['met'] else 'NOT met'} {shown}")
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
