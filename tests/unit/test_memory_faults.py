"""Fault injection of the simulator: deterministic per seed, both unknown-result outcomes."""

from __future__ import annotations

import time

import pytest

from quickzones.backends.memory import FAULT_KINDS, FaultConfig, MemoryStore
from quickzones.clock import ManualClock
from quickzones.errors import InvalidArgument, InvalidStoreURL
from quickzones.store.kv import (
    COMMIT_UNKNOWN_RESULT,
    NOT_COMMITTED,
    TRANSACTION_TOO_OLD,
    KVError,
    KVTransaction,
    pack_i64,
    run,
    unpack_i64,
)
from quickzones.urls import open_kv

MIXED = FaultConfig(not_committed=0.2, unknown_result=0.2, too_old=0.1)


def outcomes(store: MemoryStore, commits: int) -> list[int]:
    """Commit ``commits`` one-key transactions without retrying; 0 = success, else code."""
    seen = []
    for i in range(commits):
        tr = store.create_transaction()
        tr.set(b"k%d" % i, b"v")
        try:
            tr.commit()
            seen.append(0)
        except KVError as err:
            seen.append(err.code)
    return seen


def test_same_seed_gives_the_same_fault_sequence() -> None:
    a = MemoryStore(seed=7, clock=ManualClock(), faults=MIXED)
    b = MemoryStore(seed=7, clock=ManualClock(), faults=MIXED)
    seq_a, seq_b = outcomes(a, 200), outcomes(b, 200)
    assert seq_a == seq_b
    assert a.fault_counts == b.fault_counts
    assert a.snapshot_items() == b.snapshot_items()
    assert {NOT_COMMITTED, COMMIT_UNKNOWN_RESULT, TRANSACTION_TOO_OLD} <= set(seq_a)


def test_different_seeds_give_different_sequences() -> None:
    a = MemoryStore(seed=1, clock=ManualClock(), faults=MIXED)
    b = MemoryStore(seed=2, clock=ManualClock(), faults=MIXED)
    assert outcomes(a, 200) != outcomes(b, 200)


def test_counters_match_observed_faults() -> None:
    store = MemoryStore(seed=3, clock=ManualClock(), faults=MIXED)
    seen = outcomes(store, 300)
    counts = store.fault_counts
    assert set(counts) == set(FAULT_KINDS)
    assert counts["not_committed"] == seen.count(NOT_COMMITTED)
    assert counts["too_old"] == seen.count(TRANSACTION_TOO_OLD)
    unknown = counts["unknown_result_applied"] + counts["unknown_result_not_applied"]
    assert unknown == seen.count(COMMIT_UNKNOWN_RESULT)
    assert counts["unknown_result_applied"] > 0 and counts["unknown_result_not_applied"] > 0
    # Successful commits plus unknown-but-applied ones are exactly the keys written.
    assert len(store.snapshot_items()) == seen.count(0) + counts["unknown_result_applied"]


@pytest.mark.parametrize("applied", [True, False])
def test_commit_unknown_result_both_ways(applied: bool) -> None:
    faults = FaultConfig(unknown_result=1.0, unknown_result_applied=1.0 if applied else 0.0)
    store = MemoryStore(seed=0, clock=ManualClock(), faults=faults)
    tr = store.create_transaction()
    tr.set(b"k", b"v")
    with pytest.raises(KVError) as info:
        tr.commit()
    assert info.value.code == COMMIT_UNKNOWN_RESULT and info.value.maybe_committed
    assert info.value.retryable
    assert store.snapshot_items() == ({b"k": b"v"} if applied else {})
    kind = "unknown_result_applied" if applied else "unknown_result_not_applied"
    assert store.fault_counts[kind] == 1


def test_spurious_not_committed_applies_nothing_and_spares_read_only() -> None:
    store = MemoryStore(seed=0, clock=ManualClock(), faults=FaultConfig(not_committed=1.0))
    tr = store.create_transaction()
    tr.set(b"k", b"v")
    with pytest.raises(KVError) as info:
        tr.commit()
    assert info.value.code == NOT_COMMITTED
    assert store.snapshot_items() == {}
    reader = store.create_transaction()
    reader.get(b"k")
    reader.commit()  # read-only commits send nothing, so nothing can be injected
    assert store.fault_counts["not_committed"] == 1


def test_retry_loop_converges_under_faults_with_idempotent_bodies() -> None:
    clock = ManualClock()
    store = MemoryStore(seed=11, clock=clock, faults=MIXED)

    def mark(i: int) -> None:
        def fn(tr: KVTransaction) -> None:
            # Idempotent: re-running after an applied 1021 rewrites the same value.
            tr.set(b"item/%03d" % i, b"done")

        run(store, fn)

    for i in range(100):
        mark(i)
    assert len(store.snapshot_items()) == 100
    assert sum(store.fault_counts.values()) > 0


def test_non_idempotent_counter_can_double_apply_under_unknown_result() -> None:
    faults = FaultConfig(unknown_result=0.3, unknown_result_applied=1.0)
    store = MemoryStore(seed=5, clock=ManualClock(), faults=faults)
    for _ in range(50):
        run(store, lambda tr: tr.add(b"n", pack_i64(1)))
    total = unpack_i64(store.snapshot_items()[b"n"])
    # Every applied 1021 was retried and applied again: the classic duplicate.
    assert total == 50 + store.fault_counts["unknown_result_applied"]
    assert total > 50


def test_latency_and_backoff_advance_the_manual_clock_not_real_time() -> None:
    clock = ManualClock()
    start = clock.now()
    faults = FaultConfig(latency_ms=250, not_committed=0.5)
    store = MemoryStore(seed=9, clock=clock, faults=faults)
    wall = time.monotonic()

    def write(tr: KVTransaction) -> None:
        tr.set(b"k", b"v")

    for _ in range(40):
        run(store, write)
    assert time.monotonic() - wall < 1.0
    assert store.fault_counts["latency"] >= 40
    assert clock.now() - start >= 40 * 0.25


def test_faults_from_url_and_open_kv() -> None:
    url = "memory://?seed=7&fault_not_committed=0.2&fault_unknown_result=0.2&fault_too_old=0.1"
    a = MemoryStore.from_url(url, clock=ManualClock())
    b = open_kv(url, clock=ManualClock())
    assert isinstance(b, MemoryStore) and a is not b
    assert a.faults == MIXED and a.seed == 7
    assert outcomes(a, 100) == outcomes(b, 100)


def test_named_memory_url_is_shared_within_the_process() -> None:
    try:
        a = MemoryStore.from_url("memory://demo-shared")
        b = MemoryStore.from_url("memory://demo-shared")
        c = MemoryStore.from_url("memory://")
        assert a is b and a is not c
        run(a, lambda tr: tr.set(b"k", b"v"))
        b.close()  # closing one user's handle keeps the shared store open
        assert run(a, lambda tr: tr.get(b"k")) == b"v"
        assert c.snapshot_items() == {}
    finally:
        MemoryStore.forget_shared("demo-shared")


@pytest.mark.parametrize(
    "url",
    [
        "memory://?fault_typo=0.1",
        "memory://?fault_not_committed=2",
        "memory://?seed=abc",
        "memory:///path",
    ],
)
def test_bad_memory_urls_are_rejected(url: str) -> None:
    with pytest.raises(InvalidStoreURL):
        MemoryStore.from_url(url)


def test_fault_probabilities_are_validated() -> None:
    with pytest.raises(InvalidArgument):
        FaultConfig(not_committed=-0.1)
    with pytest.raises(InvalidArgument):
        FaultConfig(latency_ms=-1)
