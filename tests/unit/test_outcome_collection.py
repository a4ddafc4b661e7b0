"""Expired outcome records are collected without a scan of all tenants (issue 15 point 2):
``outcomes.collect_expired_outcomes`` is the step a consumer's maintenance runs."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.errors import InvalidArgument
from quickzones.registry import JobContext
from quickzones.store.kv import KVStore, KVTransaction
from quickzones.store.outcomes import collect_expired_outcomes


class _CountingTransaction:
    def __init__(self, tr: KVTransaction, store: CountingStore) -> None:
        self._tr = tr
        self._store = store

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        self._store.keys_read += 1
        return self._tr.get(key, snapshot=snapshot)

    def get_range(self, *args: Any, **kwargs: Any) -> list[tuple[bytes, bytes]]:
        rows = self._tr.get_range(*args, **kwargs)
        self._store.keys_read += len(rows)
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)


class CountingStore:
    """A store that counts the keys its transactions read."""

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self.keys_read = 0
        self.transactions = 0

    def create_transaction(self) -> KVTransaction:
        self.transactions += 1
        return _CountingTransaction(self._store.create_transaction(), self)  # type: ignore[return-value]

    def close(self) -> None:
        self._store.close()


def _finish(q: Quick, tenants: int, keep_s: float, job: str) -> None:
    @q.job(job, keep_status_s=keep_s)
    def handler(payload: object, ctx: JobContext) -> None:
        return None

    for n in range(tenants):
        q.enqueue(job, {}, app="a", tenant=f"{job}-{n}", item_id="r")
    q.run_until_idle()


def test_expired_records_go_and_kept_ones_stay(q: Quick, clock: ManualClock) -> None:
    _finish(q, 5, 10, "short")
    _finish(q, 5, 3600, "long")
    assert collect_expired_outcomes(q.kv, q.keys, now_ms(q.clock)) == 0
    clock.advance(11)
    assert collect_expired_outcomes(q.kv, q.keys, now_ms(q.clock)) == 5
    assert q.status("a", "short-0", "r") is None
    status = q.status("a", "long-0", "r")
    assert status is not None and status.state == "completed"
    assert collect_expired_outcomes(q.kv, q.keys, now_ms(q.clock)) == 0


def test_collection_reads_only_what_expired_not_every_tenant(q: Quick, clock: ManualClock) -> None:
    _finish(q, 3, 10, "short")
    _finish(q, 60, 3600, "long")
    clock.advance(11)
    counting = CountingStore(q.kv)
    assert collect_expired_outcomes(counting, q.keys, now_ms(q.clock)) == 3
    # Three index entries and three records: nothing of the 60 tenants whose records stay.
    assert counting.keys_read <= 6


def test_batches_are_bounded_and_the_rest_waits_for_the_next_call(
    q: Quick, clock: ManualClock
) -> None:
    _finish(q, 7, 10, "short")
    clock.advance(11)
    counting = CountingStore(q.kv)
    # At most limit * max_batches per call, each batch its own transaction.
    assert collect_expired_outcomes(counting, q.keys, now_ms(q.clock), 3, max_batches=2) == 6
    assert counting.transactions == 2
    assert collect_expired_outcomes(q.kv, q.keys, now_ms(q.clock), 3, max_batches=2) == 1


@pytest.mark.parametrize("limit,max_batches", [(0, 1), (1, 0), (-5, 3)])
def test_bad_bounds_are_refused(q: Quick, limit: int, max_batches: int) -> None:
    with pytest.raises(InvalidArgument):
        collect_expired_outcomes(q.kv, q.keys, 0, limit, max_batches=max_batches)


def test_a_running_consumer_collects_expired_records_on_its_own(tmp_path: Any) -> None:
    # A user keeps statuses for a short while and runs only a consumer: the records must
    # not pile up forever without an explicit collect call.
    import time

    from quickzones.consumer import ConsumerConfig

    q = Quick.open(f"sqlite:///{tmp_path / 'gc.db'}")
    try:

        @q.job("short", keep_status_s=1.0)
        def handler(payload: object, ctx: JobContext) -> None:
            return None

        for n in range(5):
            q.enqueue("short", {}, app="a", tenant=f"t{n}", item_id="r")
        consumer = q.consumer(ConsumerConfig(idle_sleep_s=0.01, outcome_gc_interval_s=0.1))
        consumer.start()
        try:
            deadline = time.monotonic() + 30
            # First every item runs and leaves its record (and expiry entry)...
            while time.monotonic() < deadline and _outcome_keys(q) < 10:
                time.sleep(0.02)
            assert _outcome_keys(q) == 10
            # ...then, with no call from the user, the expired records go.
            while time.monotonic() < deadline and _outcome_keys(q):
                time.sleep(0.05)
        finally:
            consumer.stop()
        assert _outcome_keys(q) == 0
        assert all(q.status("a", f"t{n}", "r") is None for n in range(5))
    finally:
        q.close()


def _outcome_keys(q: Quick) -> int:
    """Outcome records and expiry index entries still stored (ran or not)."""
    from quickzones.store.kv import run

    def count(tr: KVTransaction) -> int:
        records = tr.get_range(*q.keys.outcomes_range())
        index = tr.get_range(*q.keys.outcome_expiry_range(2**62))
        return len(records) + len(index)

    return run(q.kv, count)


def test_outcome_gc_interval_must_be_positive() -> None:
    from quickzones.consumer import ConsumerConfig
    from quickzones.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        ConsumerConfig(outcome_gc_interval_s=0).validate()
