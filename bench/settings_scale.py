"""What one app's settings cost another app's drain (issue 43 point 1): app "a" stores
pauses, tenant limits or a weight for many of its tenants; app "b" drains its own work
with ``run_until_idle`` on the system clock. Prints, per case, the items run, the store
reads and keys read during the drain (counted by a wrapping KV store) and the seconds.

    python -m bench.settings_scale [--pauses 10000] [--limits 40000] [--store memory]

Counts are exact; times are wall-clock on a shared machine (noisy)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, NamedTuple

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.urls import open_kv


class _CountingTransaction:
    def __init__(self, tr: Any, store: Counting) -> None:
        self._tr, self._store = tr, store

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        value = self._tr.get(key, snapshot=snapshot)
        self._store.reads += 1
        self._store.keys += value is not None
        return value  # type: ignore[no-any-return]

    def get_range(self, *args: Any, **kwargs: Any) -> list[tuple[bytes, bytes]]:
        rows = self._tr.get_range(*args, **kwargs)
        self._store.reads += 1
        self._store.keys += len(rows)
        return rows  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)


class Counting:
    def __init__(self, store: Any) -> None:
        self._store, self.reads, self.keys = store, 0, 0

    def create_transaction(self) -> Any:
        return _CountingTransaction(self._store.create_transaction(), self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


Setup = Callable[[Quick], None]


class Drain(NamedTuple):
    ran: int
    reads: int
    keys: int
    seconds: float
    # This process's CPU seconds over the drain (run_until_idle runs in it): the figure
    # a shared host's load moves least, where the wall seconds move with it.
    cpu_s: float


def drain(url: str, setup: Setup, tenants: int, items: int) -> Drain:
    """App b's drain on the store ``url`` after ``setup``: ``tenants`` x ``items`` no-op
    items run by ``run_until_idle``; returns items run, store reads, keys read, seconds
    and CPU seconds (bench.tenant_scale runs it on a store holding many other tenants)."""
    kv = Counting(open_kv(url))
    q = Quick(kv)  # type: ignore[arg-type]
    try:
        ran = [0]

        def handler(payload: Any, ctx: Any) -> None:
            ran[0] += 1

        q.job("j")(handler)
        setup(q)
        for t in range(tenants):
            q.enqueue_many("j", [b""] * items, app="b", tenant=f"t{t}")
        kv.reads = kv.keys = 0
        start, cpu = time.perf_counter(), time.process_time()
        q.run_until_idle(ConsumerConfig(in_order=True, seed=0))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return Drain(ran[0], kv.reads, kv.keys, seconds, cpu)
    finally:
        q.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pauses", type=int, default=10_000)
    ap.add_argument("--limits", type=int, default=40_000)
    ap.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    args = ap.parse_args()

    def pauses(q: Quick) -> None:
        for i in range(args.pauses):
            q.pause(app="a", tenant=f"x{i}")

    def limits(q: Quick) -> None:
        for i in range(args.limits):
            q.set_tenant_limit("a", f"x{i}", max_running=2)

    def weight(q: Quick) -> None:
        q.set_weight("a", "x", 5)

    cases: list[tuple[str, Setup, int, int]] = [
        ("nothing stored", lambda q: None, 50, 40),
        (f"{args.pauses:,} pauses in app a", pauses, 50, 40),
        (f"{args.limits:,} tenant limits in app a", limits, 50, 40),
        ("nothing stored, 24 tenants x 100", lambda q: None, 24, 100),
        ("one weight in app a, 24 tenants x 100", weight, 24, 100),
        ("nothing stored, a lone tenant x 2,000", lambda q: None, 1, 2_000),
        ("one weight in app a, a lone tenant x 2,000", weight, 1, 2_000),
    ]
    with TemporaryDirectory() as folder:
        for name, setup, tenants, items in cases:
            url = "memory://" if args.store == "memory" else f"sqlite:///{Path(folder) / name}.db"
            ran, reads, keys, seconds, _cpu = drain(url, setup, tenants, items)
            print(
                f"{name:45s} ran {ran:5d}/{tenants * items:5d}  reads {reads:7d}  "
                f"keys read {keys:8d}  {seconds:6.2f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
