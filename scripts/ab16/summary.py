"""Medians per variant of the A/B runs scripts/ab16/run.sh wrote: ``python3
scripts/ab16/summary.py OUT`` prints a Markdown table (small tenants' pickup under the noisy
neighbour, the lone tenant's rate and CPU per 1,000 items, Huey beside variant A) and the
FoundationDB scaling runs."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} (n={len(xs)})" if xs else "-"


def main(out: Path) -> None:
    rows: dict[str, dict[str, list[float]]] = {}
    for f in out.glob("n-*/noisy_pickup.json"):
        got = rows.setdefault(f.parent.name.split("-")[1], {})
        summary = json.loads(f.read_text())["summary"].get("quick-sqlite", {})
        for key in ("small_p99", "small_p50", "small_p99_after_burst"):
            if key in summary:
                got.setdefault(key, []).append(summary[key]["median"])
    for f in out.glob("l-*/lone_tenant.json"):
        got = rows.setdefault(f.parent.name.split("-")[1], {})
        run = json.loads(f.read_text())
        for system, rate in run.get("rates", {}).items():
            key = "rate" if system.startswith("quick-sqlite-user") else "huey"
            measured = rate["median"] == rate["median"]  # NaN: the run failed
            if system.startswith(("quick-sqlite-user", "huey")) and measured:
                got.setdefault(key, []).append(rate["median"])
        cpu = run.get("cpu_s_per_1000_items", {}).get("quick-sqlite-user")
        if cpu:
            got.setdefault("cpu", []).append(cpu["median"] * 1000)
    print("| variant | small p99 ms | small p50 ms | p99 after burst | lone items/s "
          "| CPU ms / 1,000 | Huey items/s |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(rows, key=lambda v: (v != "A", v)):
        r = rows[name]
        cells = ("small_p99", "small_p50", "small_p99_after_burst", "rate", "cpu", "huey")
        print(f"| {name} | " + " | ".join(_median(r.get(c, [])) for c in cells) + " |")
    print("\nFoundationDB, quick worker --processes 1 and 2 on two cores:")
    for f in sorted(out.glob("fdb-*/scaling.json")):
        rows_ = json.loads(f.read_text())["rows"]
        print(f.parent.name, "; ".join(
            f"{r['processes']}p {r['items_per_s']:.0f}/s x{r['ratio_to_one']:.2f} "
            f"lost {r['pointer_leases_lost']}/{r['pointer_leases']}" for r in rows_))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
