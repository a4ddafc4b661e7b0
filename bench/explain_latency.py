"""How long ``quick explain`` takes to answer (issue 45 target: within 50 ms), each case
built on purpose, on a store with other tenants' work beside it.

    python -m bench.explain_latency [--stores sqlite,postgres] [--tenants 10000]
        [--items 1000] [--calls 200] [--cli-runs 5] [--out DIR]

Per store: ``--tenants`` other tenants of another app with one queued item each, and the
explained tenant's zone holding ``--items`` items besides the case's own. Each case is
built the way a consumer or an operator makes it (a live consumer's heartbeat, a delay,
a pause, a full tenant cap, a taken rate slot, a full app cap, a one-at-a-time key held
by a running item, nothing holding), checked to name the rule it was built for, then
answered ``--calls`` times by :func:`quickzones.explain.explain` (what ``quick explain``,
``GET .../items/{id}/explain`` and the item page call): p50/p99/max in ms. The CLI's own
answer is also timed end to end (``python -m quickzones explain``, ``--cli-runs`` calls: a process
start, imports and the store's open included).
Results: ``bench/results/<UTC timestamp>-explain-latency/explain_latency.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import child_env, latency_summary, log, machine, run_folder
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.explain import explain
from quickzones.store import heartbeats
from quickzones.store.heartbeats import Heartbeat
from quickzones.store.limits import AppLimits

LEASE_MS = 600_000
TARGET_MS = 50.0


def _consumer(q: Quick) -> None:
    """A live consumer's heartbeat, as a running consumer writes it (valid 10 minutes)."""
    now = now_ms(q.clock)
    record = Heartbeat("c1", "host", 1, now, now, 600_000, 8, 0, 0, None, None, ())
    heartbeats.beat(q.kv, q.keys, record, now)


def _vesting(q: Quick) -> str:
    return q.enqueue("j", b"", app="a", tenant="vesting", delay=3600)


def _paused(q: Quick) -> str:
    q.pause(app="a", tenant="paused")
    return q.enqueue("j", b"", app="a", tenant="paused")


def _tenant_cap(q: Quick) -> str:
    q.set_tenant_limit("a", "capped", max_running=1)
    q.enqueue("j", b"", app="a", tenant="capped", priority=-1)
    assert q.limits.acquire_slots("tenant", ("a", "capped"), "c1", 1, 1, LEASE_MS) == 1
    q.zones.dequeue(q.zone("a", "capped"), 1, LEASE_MS)
    return q.enqueue("j", b"", app="a", tenant="capped")


def _tenant_rate(q: Quick) -> str:
    q.set_tenant_limit("a", "rated", rate=1, per=3600)
    assert q.limits.grant_starts(("a", "rated"), 1, 1, 3_600_000)[0] == 1
    return q.enqueue("j", b"", app="a", tenant="rated")


def _app_cap(q: Quick) -> str:
    q.set_limits("c", AppLimits(max_concurrency=1))
    q.limits.acquire_slots("app", "c", "c1", 1, 1, LEASE_MS)
    return q.enqueue("j", b"", app="c", tenant="t")


def _one_at_a_time(q: Quick) -> str:
    q.enqueue("j", b"", app="a", tenant="keyed", one_at_a_time="acct")
    q.zones.dequeue(q.zone("a", "keyed"), 1, LEASE_MS)
    return q.enqueue("j", b"", app="a", tenant="keyed", one_at_a_time="acct")


def _runnable(q: Quick) -> str:
    return q.enqueue("j", b"", app="a", tenant="big", priority=5)


# (case, the tenant and app it is built in, the builder, the rule it must name)
CASES: list[tuple[str, str, str, Callable[[Quick], str], str | None]] = [
    ("not vested", "a", "vesting", _vesting, "vesting"),
    ("tenant paused", "a", "paused", _paused, "paused"),
    ("tenant cap full", "a", "capped", _tenant_cap, "tenant_cap"),
    ("tenant rate", "a", "rated", _tenant_rate, "tenant_rate"),
    ("app cap full", "c", "t", _app_cap, "app_cap"),
    ("one-at-a-time key held", "a", "keyed", _one_at_a_time, "one_at_a_time"),
    ("nothing holds (zone of --items)", "a", "big", _runnable, None),
]


def _fill(q: Quick, tenants: int, items: int) -> None:
    for n in range(tenants):
        q.enqueue("j", b"", app="bg", tenant=f"t{n:07d}")
    q.enqueue_many("j", [b""] * items, app="a", tenant="big")


def measure_store(url: str, tenants: int, items: int, calls: int) -> dict[str, Any]:
    q = Quick.open(url)
    try:
        started = time.perf_counter()
        _fill(q, tenants, items)
        log(f"  filled {tenants} tenants + {items} items in {time.perf_counter() - started:.1f} s")
        _consumer(q)
        cases: dict[str, Any] = {}
        for name, app, tenant, build, rule in CASES:
            item = build(q)
            first = explain(q, app, tenant, item).first
            named = None if first is None else first.name
            assert named == rule, f"{name}: named {named}, built for {rule}"
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                explain(q, app, tenant, item)
                times.append((time.perf_counter() - t0) * 1000)
            cases[name] = {"rule": rule, "item": item, "app": app, "tenant": tenant,
                           **latency_summary(times)}  # fmt: skip
            log(f"  {name}: p50 {cases[name]['p50']:.2f} ms, p99 {cases[name]['p99']:.2f} ms")
        return cases
    finally:
        q.close()


def cli_wall(url: str, app: str, tenant: str, item: str, runs: int = 5) -> dict[str, float]:
    """``python -m quickzones explain`` end to end, as a user types it."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "quickzones", "explain", "--store", url, app, tenant, item],
            check=True,
            stdout=subprocess.DEVNULL,
            env=child_env(),
        )
        times.append((time.perf_counter() - t0) * 1000)
    return latency_summary(times)


def _urls(stores: list[str], stack: ExitStack) -> Iterator[tuple[str, str]]:
    for store in stores:
        if store == "sqlite":
            yield (
                store,
                f"sqlite:///{Path(stack.enter_context(tempfile.TemporaryDirectory()))}/q.db",
            )
        elif store == "postgres":
            from bench.servers import postgres_server

            yield store, f"{stack.enter_context(postgres_server())}?schema=explain"
        else:
            raise SystemExit(f"--stores: unknown store {store!r} (sqlite, postgres)")


def table(results: dict[str, Any]) -> str:
    stores = list(results)
    lines = [
        "| case | rule named | " + " | ".join(f"{s} p50 / p99 ms" for s in stores) + " |",
        "|---|---|" + "---|" * len(stores),
    ]
    for name, _, _, _, rule in CASES:
        cells = [
            f"{results[s]['cases'][name]['p50']:.2f} / {results[s]['cases'][name]['p99']:.2f}"
            for s in stores
        ]
        lines.append(f"| {name} | {rule or '(none)'} | " + " | ".join(cells) + " |")
    cli = [f"{results[s]['cli']['p50']:.0f} / {results[s]['cli']['max']:.0f} (max)" for s in stores]
    lines.append("| `python -m quickzones explain`, end to end | | " + " | ".join(cli) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", default="sqlite,postgres")
    ap.add_argument("--tenants", type=int, default=10_000)
    ap.add_argument("--items", type=int, default=1_000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cli-runs", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        for store, url in _urls(args.stores.split(","), stack):
            log(f"{store}: {url}")
            cases = measure_store(url, args.tenants, args.items, args.calls)
            worst = max(cases.values(), key=lambda c: c["p99"])
            results[store] = {
                "cases": cases,
                "cli": cli_wall(url, worst["app"], worst["tenant"], worst["item"], args.cli_runs),
            }
    folder = run_folder("explain-latency", args.out)
    out = {"machine": machine(), "args": vars(args), "target_ms": TARGET_MS, "stores": results}
    (folder / "explain_latency.json").write_text(json.dumps(out, indent=2))
    text = table(results)
    (folder / "table.md").write_text(text + "\n")
    print(text)
    worst_p99 = max(c["p99"] for r in results.values() for c in r["cases"].values())
    print(f"worst p99 {worst_p99:.2f} ms (target {TARGET_MS:.0f} ms): "
          f"{'met' if worst_p99 <= TARGET_MS else 'NOT met'}; results in {folder}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
