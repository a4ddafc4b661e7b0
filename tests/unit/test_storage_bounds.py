"""run() is bounded: a retry limit, a deadline, and one clear error per hopeless failure
(issue 12 point 5): too long, too large, store full, store busy."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.backends.memory import MemoryStore
from quickzones.backends.sqlite import SQLiteStore
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import (
    RetryLimitExceeded,
    StorageError,
    StoreBusy,
    StoreFull,
    TransactionTooLarge,
    TransactionTooLong,
)
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.kv import (
    TRANSACTION_SIZE_LIMIT,
    KVTransaction,
    run,
)
from tests.unit.helpers import small_fs  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]


class RetriedForever(AssertionError):
    """The body ran far more often than any bound allows: the loop has none."""


def guarded(body: Callable[[KVTransaction], Any], most: int) -> Callable[[KVTransaction], Any]:
    """``body`` that fails the test instead of looping when run more than ``most`` times."""
    calls = [0]

    def fn(tr: KVTransaction) -> Any:
        calls[0] += 1
        if calls[0] > most:
            raise RetriedForever(f"run() re-ran the body {calls[0]} times")
        return body(tr)

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def in_thread(call: Callable[[], Any], timeout: float = 120.0) -> BaseException | Any:
    """Run ``call`` in a thread; its result or exception; fail if it never returns."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(call())
        except BaseException as err:
            out.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still blocked after {timeout} s: no bound"
    return out[0]


# --- too long --------------------------------------------------------------------------


def test_a_body_longer_than_the_lifetime_fails_as_too_long_not_forever() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)

    def slow(tr: KVTransaction) -> None:
        tr.get(b"k")
        clock.advance(6.0)  # the body outlives FDB's 5 s transaction lifetime
        tr.set(b"k", b"v")

    fn = guarded(slow, most=20)
    with pytest.raises(TransactionTooLong) as info:
        run(store, fn)
    err = info.value
    assert err.elapsed_s >= 6.0 and err.limit_s == 5.0
    assert "5 s" in str(err) and "split" in str(err)
    assert fn.calls[0] <= 2  # type: ignore[attr-defined]
    assert store.snapshot_items() == {}


def test_a_transient_too_old_is_still_retried() -> None:
    # An injected 1007 on a quick body is not "too long": the retry succeeds.
    store = MemoryStore.from_url("memory://?seed=3&fault_too_old=0.5", clock=ManualClock())
    for i in range(20):
        run(store, lambda tr, i=i: tr.set(b"k%d" % i, b"v"))
    assert len(store.snapshot_items()) == 20
    assert store.fault_counts["too_old"] > 0


# --- retry limit and deadline ------------------------------------------------------------


def always_conflicting(clock: ManualClock, options: str = "") -> MemoryStore:
    return MemoryStore.from_url(f"memory://?seed=1&fault_not_committed=1.0{options}", clock=clock)


def test_retry_limit_of_run_raises_retry_limit_exceeded() -> None:
    store = always_conflicting(ManualClock())
    fn = guarded(lambda tr: tr.set(b"k", b"v"), most=1000)
    with pytest.raises(RetryLimitExceeded) as info:
        run(store, fn, retry_limit=3)
    err = info.value
    assert err.attempts == 4 and fn.calls[0] == 4  # type: ignore[attr-defined]
    assert err.last_error is not None and "not_committed" in str(err.last_error)
    assert "retry limit of 3" in str(err) and "not_committed" in str(err)


def test_default_retry_limit_bounds_a_transaction_that_always_conflicts() -> None:
    store = always_conflicting(ManualClock())
    fn = guarded(lambda tr: tr.set(b"k", b"v"), most=100_000)
    with pytest.raises(RetryLimitExceeded):
        run(store, fn)
    assert fn.calls[0] <= 1000  # type: ignore[attr-defined]


def test_retry_limit_and_timeout_are_store_url_options() -> None:
    store = always_conflicting(ManualClock(), "&retry_limit=2")
    with pytest.raises(RetryLimitExceeded) as info:
        run(store, lambda tr: tr.set(b"k", b"v"))
    assert info.value.attempts == 3
    clock = ManualClock()
    timed = always_conflicting(clock, "&retry_limit=1000000&timeout_ms=2000")
    start = clock.now()
    with pytest.raises(RetryLimitExceeded) as info:
        run(timed, lambda tr: tr.set(b"k", b"v"))
    assert "timeout of 2" in str(info.value)
    # Backoff sleeps advance the manual clock; the deadline stopped the loop soon after.
    assert 2.0 <= clock.now() - start < 4.0


def test_quick_open_passes_retry_options_to_the_store(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}?retry_limit=7&timeout_ms=1500")
    assert q.kv.retry_limit == 7 and q.kv.timeout_ms == 1500  # type: ignore[attr-defined]
    q.close()


# --- too large ---------------------------------------------------------------------------


def test_enqueue_many_over_the_size_limit_fails_at_once_with_the_limit() -> None:
    q = Quick.open("memory://", clock=ManualClock())
    payloads = [b"x" * 50_000] * 300  # 15 MB of payload: over FDB's 10 MB
    commits = q.kv.stats["commits"]  # type: ignore[attr-defined]
    with pytest.raises(TransactionTooLarge) as info:
        q.enqueue_many("job", payloads, app="a", tenant="t")
    err = info.value
    assert err.limit == TRANSACTION_SIZE_LIMIT and str(TRANSACTION_SIZE_LIMIT) in str(err)
    assert q.kv.stats["commits"] == commits  # type: ignore[attr-defined]
    assert q.zones.count(q.zone("a", "t")) == 0
    # Under the limit it still commits in one transaction.
    assert len(q.enqueue_many("job", [b"x" * 50_000] * 100, app="a", tenant="t")) == 100


def test_a_transaction_over_the_size_limit_is_too_large_not_retried() -> None:
    store = MemoryStore(clock=ManualClock())

    def big(tr: KVTransaction) -> None:
        for i in range(120):
            tr.set(b"k%04d" % i, b"v" * 90_000)

    fn = guarded(big, most=5)
    with pytest.raises(TransactionTooLarge) as info:
        run(store, fn)
    assert info.value.size is not None and info.value.size > TRANSACTION_SIZE_LIMIT
    assert fn.calls[0] == 1  # type: ignore[attr-defined]


# --- store busy --------------------------------------------------------------------------

HOLD_WRITE_LOCK = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def lock_holder(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    path = str(tmp_path / "busy.db")
    SQLiteStore(path).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, path], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    yield path, proc
    proc.kill()
    proc.wait(timeout=10)


def test_another_process_holding_the_write_lock_gives_store_busy(
    lock_holder: tuple[str, subprocess.Popen[str]],
) -> None:
    path, _ = lock_holder
    store = SQLiteStore(path, busy_timeout_ms=300)
    fn = guarded(lambda tr: tr.set(b"k", b"v"), most=50)
    started = time.monotonic()
    outcome = in_thread(lambda: run(store, fn))
    assert isinstance(outcome, StoreBusy), outcome
    assert outcome.busy_timeout_ms == 300
    assert "300 ms" in str(outcome) and "busy_timeout_ms" in str(outcome)
    assert time.monotonic() - started < 60  # generous: about 0.3 s on a quiet machine
    # Reads still work while another process writes (WAL).
    assert run(store, lambda tr: tr.get(b"k")) is None
    store.close()


def test_a_writer_waits_for_a_short_lock_within_busy_timeout(
    lock_holder: tuple[str, subprocess.Popen[str]],
) -> None:
    path, proc = lock_holder
    store = SQLiteStore(path, busy_timeout_ms=60_000)
    threading.Timer(0.3, proc.kill).start()
    run(store, lambda tr: tr.set(b"k", b"v"))
    assert store.snapshot_items() == {b"k": b"v"}
    store.close()


# --- store full --------------------------------------------------------------------------


def test_a_full_disk_gives_store_full_and_loses_nothing_committed(
    small_fs: Path,  # noqa: F811  (the fixture imported above)
) -> None:
    path = str(small_fs / "full.db")
    store = SQLiteStore(path)
    committed = 0
    outcome: BaseException | None = None
    fn_calls = [0]
    for i in range(1000):

        def write(tr: KVTransaction, i: int = i) -> None:
            fn_calls[0] += 1
            if fn_calls[0] > i + 50:
                raise RetriedForever("a full disk is retried")
            for j in range(20):
                tr.set(b"k%04d-%02d" % (i, j), os.urandom(1000))

        try:
            run(store, write)
        except StorageError as err:
            outcome = err
            break
        committed += 1
    assert isinstance(outcome, StoreFull), outcome
    assert "full" in str(outcome) and path in str(outcome)
    assert committed > 0
    store.close()
    # Everything that committed before the disk filled is still there.
    reopened = SQLiteStore(path)
    assert len(reopened.snapshot_items()) == committed * 20
    reopened.close()


# --- a handler that hits a bound takes the normal failure path ---------------------------


def test_a_transactional_handler_outliving_the_lifetime_ends_as_a_dead_letter() -> None:
    from quickzones.consumer import ConsumerConfig

    clock = ManualClock()
    q = Quick.open("memory://", clock=clock)
    attempts: list[int] = []

    @q.job(
        "slow",
        transactional=True,
        retry=RetryPolicy(max_attempts=2, backoff_base_s=0.5, jitter=False),
    )
    def slow(payload: Any, ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) > 20:
            raise RetriedForever("the handler's transaction is retried without end")
        assert ctx.tr is not None
        ctx.tr.get(b"user/x")
        clock.advance(6.0)  # the body outlives the 5 s transaction lifetime
        ctx.tr.set(b"user/x", b"done")

    item_id = q.enqueue("slow", b"", app="a", tenant="t")
    consumer = q.consumer(ConsumerConfig(in_order=True))
    consumer.run_until_idle()
    item = q.get("a", "t", item_id)
    assert item is not None and item.error_count == 1  # the attempt was counted
    assert "TransactionTooLong" in (item.last_error or "")
    clock.advance(1.0)  # past the backoff
    consumer.run_until_idle()
    # Each handler attempt ran its body at most twice (one slow run is forgiven).
    assert sorted(set(attempts)) == [1, 2] and len(attempts) <= 4
    assert q.get("a", "t", item_id) is None
    [dead] = q.dead_letters()
    assert dead.item_id == item_id and "TransactionTooLong" in dead.reason
    # Neither attempt's effect committed.
    assert run(q.kv, lambda tr: tr.get(b"user/x")) is None
    q.close()
