"""A wall clock set back (by an administrator, NTP, a VM restore) must not stall queued or
leased items: delays and leases are measured on a time that never runs backwards across
the processes sharing a store (issue 12 point 10, docs/guarantees.md#clock-steps).

Each test opens its Quick with ``steady_clock=True`` over a ManualClock (the default system
clock is steady already); ``step_back`` moves the wall reading without time passing. A
second Quick over the same store with its own ManualClock is a process started after the
step.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, SystemClock
from quickzones.errors import ConfigurationError, StorageError
from quickzones.registry import JobContext
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from quickzones.store.steady_clock import SteadyClock
from quickzones.testing import run_until_idle
from tests.conftest import store_url

Z = ZoneId("app", "t1")
HOUR = 3600.0


@pytest.fixture
def q(backend: str, tmp_path: Path, clock: ManualClock) -> Iterator[Quick]:
    quick = Quick.open(store_url(backend, tmp_path), clock=clock, steady_clock=True)
    yield quick
    quick.close()


def runs(q: Quick) -> list[str]:
    """Register the handler; the list collects the ids of the items it ran."""
    ran: list[str] = []

    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    return ran


def new_process(q: Quick, wall: float) -> tuple[Quick, ManualClock]:
    """Another process on the same store, started with its wall clock reading ``wall``."""
    clock = ManualClock(wall)
    return Quick(q.kv, clock=clock, steady_clock=True), clock


def test_delayed_item_runs_after_its_delay_when_the_clock_steps_back(
    q: Quick, clock: ManualClock
) -> None:
    ran = runs(q)
    item_id = q.enqueue("job", b"", app=Z.app, tenant=Z.tenant, delay=5)
    clock.step_back(HOUR)
    assert q.run_until_idle() == 0
    clock.advance(4)
    assert q.run_until_idle() == 0  # the delay is not cut short either
    clock.advance(1.1)
    assert q.run_until_idle() == 1  # 5 s after the enqueue, not an hour and 5 s
    assert ran == [item_id]


def test_process_started_after_a_step_back_runs_delayed_items_on_time(
    q: Quick, clock: ManualClock
) -> None:
    item_id = q.enqueue("job", b"", app=Z.app, tenant=Z.tenant, delay=5)
    later, later_clock = new_process(q, clock.now() - HOUR)
    ran = runs(later)
    assert later.run_until_idle() == 0
    later_clock.advance(5.1)
    assert later.run_until_idle() == 1
    assert ran == [item_id]


def test_dead_consumers_lease_expires_after_its_duration_on_the_stepped_clock(
    q: Quick, clock: ManualClock
) -> None:
    item_id = q.enqueue("job", b"", app=Z.app, tenant=Z.tenant)
    [leased], _ = q.zones.dequeue(Z, 1, 30_000)  # a consumer takes a 30 s lease and dies
    assert leased.item_id == item_id
    later, later_clock = new_process(q, clock.now() - HOUR)
    ran = runs(later)
    assert later.run_until_idle() == 0  # it starts polling: the lease is held
    later_clock.advance(29)
    assert later.run_until_idle() == 0  # the lease holds for its whole duration
    later_clock.advance(1.1)
    assert later.run_until_idle() == 1  # and ends 30 s after it was taken
    assert ran == [item_id]


def test_lease_of_a_process_whose_own_clock_steps_back_expires_on_time(
    q: Quick, clock: ManualClock
) -> None:
    ran = runs(q)
    item_id = q.enqueue("job", b"", app=Z.app, tenant=Z.tenant)
    q.zones.dequeue(Z, 1, 30_000)
    clock.step_back(HOUR)
    clock.advance(29)
    assert q.run_until_idle() == 0
    clock.advance(1.1)
    assert q.run_until_idle() == 1
    assert ran == [item_id]


def test_producer_started_after_a_step_back_keeps_the_delay(q: Quick, clock: ManualClock) -> None:
    ran = runs(q)
    q.enqueue("job", b"", app=Z.app, tenant="warm-up")  # the store has seen this time
    assert q.run_until_idle() == 1
    producer, _ = new_process(q, clock.now() - HOUR)
    item_id = producer.enqueue("job", b"", app=Z.app, tenant=Z.tenant, delay=5)
    assert q.run_until_idle() == 0  # not an hour early
    clock.advance(5.1)
    assert q.run_until_idle() == 1
    assert ran[-1] == item_id


def test_time_never_runs_backwards_and_follows_forward_steps(q: Quick, clock: ManualClock) -> None:
    t0 = q.clock.now()
    clock.step_back(HOUR)
    assert q.clock.now() == t0  # no time passed
    clock.advance(2)
    assert q.clock.now() == pytest.approx(t0 + 2)
    clock.set(t0 + 100)  # the wall clock catches up and passes: it leads again
    assert q.clock.now() == pytest.approx(t0 + 100)
    clock.step_back(10)
    clock.step_back(10)
    assert q.clock.now() == pytest.approx(t0 + 100)


def test_store_is_read_at_most_once_per_sync_period(q: Quick, clock: ManualClock) -> None:
    opened: list[int] = []
    real = q.kv.create_transaction

    def counting() -> KVTransaction:
        opened.append(1)
        return real()

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    # The exchanges after the first run beside the callers; here each as it is due, so
    # that they can be counted.
    steady = SteadyClock(q.kv, q.keys.meta_key("clock"), clock, beside=lambda run: run())
    for _ in range(1000):
        steady.now()
    assert len(opened) <= 1
    for _ in range(100):
        clock.advance(0.1)
        steady.now()
    assert 5 <= len(opened) <= 12  # about one exchange a second of elapsed time


def test_clock_keeps_running_when_the_store_fails(q: Quick, clock: ManualClock) -> None:
    t0 = q.clock.now()

    def broken() -> KVTransaction:
        raise StorageError("store unreachable")

    q.kv.create_transaction = broken  # type: ignore[method-assign]
    clock.advance(3)
    clock.step_back(HOUR)
    assert q.clock.now() == pytest.approx(t0 + 3)


def test_default_clock_is_steady_and_a_passed_clock_is_used_as_given() -> None:
    default = Quick.open("memory://")
    assert default.clock is not None and type(default.clock) is not SystemClock
    manual = ManualClock()
    given = Quick(default.kv, clock=manual)
    assert given.clock is manual
    default.close()


def test_steady_clock_needs_a_clock_that_measures_elapsed_time() -> None:
    class WallOnly:
        def now(self) -> float:
            return 1.0

        def sleep(self, seconds: float) -> None:
            pass

    with pytest.raises(ConfigurationError, match="monotonic"):
        Quick.open("memory://", clock=WallOnly(), steady_clock=True)


def test_run_until_idle_advances_a_steady_manual_clock(q: Quick, clock: ManualClock) -> None:
    ran = runs(q)
    q.enqueue("job", b"", app=Z.app, tenant=Z.tenant, delay=60)
    assert run_until_idle(q, advance_clock=True) == 1
    assert len(ran) == 1


def test_forked_child_gets_fresh_locks(q: Quick) -> None:
    import os

    assert isinstance(q.clock, SteadyClock)
    q.clock._sync_lock.acquire()  # a thread of the parent is mid-exchange at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: it must be able to exchange with nobody holding the lock
            ok = q.clock._sync_lock.acquire(blocking=False)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        q.clock._sync_lock.release()
    assert os.waitstatus_to_exitcode(status) == 0


class _PreemptedClock(ManualClock):
    """A clock whose next reading, wall or elapsed, is followed by ``gap`` s passing before
    anything else is read: a thread descheduled (or waiting for the GIL) between the two
    readings a steady clock takes."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self.gap = 0.0

    def _then_pause(self, reading: float) -> float:
        if self.gap:
            gap, self.gap = self.gap, 0.0
            self.advance(gap)
        return reading

    def now(self) -> float:
        return self._then_pause(super().now())

    def monotonic(self) -> float:
        return self._then_pause(super().monotonic())


def test_a_pause_between_the_two_readings_does_not_move_the_clock_ahead(tmp_path: Path) -> None:
    """A steady clock must not run ahead of the wall clock when nothing stepped: it read the
    elapsed time, then the wall time 4 ms later, and kept the pair as its floor, so from
    then on it read 4 ms ahead, and every longer pause moved it further. A delayed item
    then vested and started early by the wall clock (0.25-0.5 ms in the peer benchmark)."""
    base = _PreemptedClock(1_700_000_000.0)
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}", clock=base, steady_clock=True)
    try:
        clock = q.clock
        clock.now()  # the first reading exchanges the floor with the store
        base.advance(0.010)
        base.gap = 0.004
        clock.now()
        base.advance(0.010)
        assert clock.now() <= base.now() + 1e-9  # not 4 ms ahead
    finally:
        q.close()
