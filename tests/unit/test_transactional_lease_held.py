"""A transactional handler that runs longer than the item lease keeps its lease (issue 40
point 8): its item is neither leased again by another consumer while it runs (a lapse)
nor dead-lettered as "lease lapsed 3 times", and its effect commits exactly once.

The handler's transaction completes its item, so the lease extender cannot renew the
lease while it runs (the renewal would rewrite the record the completion reads, and the
completion would conflict); the worker takes the lease for the transaction's whole
lifetime instead, before each attempt."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from quickzones.store.kv import KVTransaction, run, unpack_i64
from tests.waiting import wait_for

LEASE_S = 1.0
HANDLER_S = 2.5  # well past the lease, within the 5 s a transaction may live
ITEMS = 30


def _counts(q: Quick) -> dict[str, int]:
    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        return tr.get_range(b"ran/", b"ran0", snapshot=True)

    return {k[4:].decode(): unpack_i64(v) for k, v in run(q.kv, read)}


def test_a_long_transactional_handler_keeps_its_lease(real_q: Quick) -> None:
    q = real_q
    events: Counter[str] = Counter()
    lock = threading.Lock()

    def observe(event: str, fields: dict[str, Any]) -> None:
        with lock:
            events[event] += 1

    @q.job("slow", transactional=True)
    def slow(payload: bytes, ctx: JobContext) -> None:
        time.sleep(HANDLER_S)
        assert ctx.tr is not None
        # Committed with the item's completion, or not at all.
        ctx.tr.add(b"ran/" + ctx.item_id.encode(), (1).to_bytes(8, "little"))

    ids = {q.enqueue("slow", b"", app="a", tenant=f"t{i % 5}") for i in range(ITEMS)}
    # Two consumers with more workers than items: a lapsed lease would be taken at once.
    config = ConsumerConfig(item_lease_s=LEASE_S, workers=20, idle_sleep_s=0.05)
    consumers = [q.consumer(config, observer=observe) for _ in range(2)]
    for c in consumers:
        c.start()
    try:
        wait_for(lambda: set(_counts(q)) >= ids or bool(q.dead_letters()), timeout=90)
    finally:
        for c in consumers:
            c.stop()
    dead = q.dead_letters()
    counts = _counts(q)
    assert not dead, f"{len(dead)} dead-lettered, e.g. {dead[0]}"
    assert set(counts) == ids, f"{len(ids - set(counts))} of {ITEMS} never committed"
    assert all(n == 1 for n in counts.values()), f"committed more than once: {counts}"
    assert events["lease_lost"] == 0, f"leases lost while running: {events['lease_lost']}"
