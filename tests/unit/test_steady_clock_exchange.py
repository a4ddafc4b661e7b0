"""The steady clock's exchange with the store (once a second of a process's activity: read
the cluster's floor, raise it to this process's time) is not any caller's work: an
enqueue made a second after the last waited for it, a round trip of its own and, on
PostgreSQL, a commit of an atomic ``max`` on the one key every process shares (seven
more writes to the server than the enqueue's one, and a wait on whoever held that key).
After the first exchange (a process started after a step back must know the floor before
it stamps anything), each runs beside the callers, which go on with the local floor."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import KVStore, KVTransaction
from quickzones.store.steady_clock import SYNC_PERIOD_S, SteadyClock
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.postgres import postgres_store_url


class GatedFloor:
    """A store whose transactions wait at the floor key's ``max`` until ``opened``."""

    def __init__(self, kv: KVStore, key: bytes) -> None:
        self.kv = kv
        self.key = key
        self.opened = threading.Event()
        self.waiting = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.kv, name)

    def create_transaction(self) -> KVTransaction:
        tr = self.kv.create_transaction()
        real_max = tr.max
        gate = self

        def gated_max(key: bytes, param: bytes) -> None:
            if key == gate.key:
                gate.waiting.set()
                assert gate.opened.wait(30), "the gate was never opened"
            real_max(key, param)

        tr.max = gated_max  # type: ignore[method-assign]
        return tr


@pytest.fixture
def gated() -> Iterator[tuple[GatedFloor, Quick]]:
    q = Quick.open("memory://")
    gate = GatedFloor(q.kv, q.keys.meta_key("clock"))
    yield gate, q
    gate.opened.set()
    q.close()


def test_time_is_told_while_an_exchange_waits_on_the_store(
    gated: tuple[GatedFloor, Quick],
) -> None:
    gate, _ = gated
    wall = ManualClock(1_000_000.0)
    clock = SteadyClock(gate, gate.key, wall)  # type: ignore[arg-type]
    gate.opened.set()
    t0 = clock.now()  # the first exchange: its caller waits for the floor
    gate.opened.clear()
    wall.advance(SYNC_PERIOD_S + 0.1)
    told: list[float] = []
    reader = threading.Thread(target=lambda: told.append(clock.now()), daemon=True)
    reader.start()
    assert gate.waiting.wait(10), "no exchange began once a period had passed"
    reader.join(10)
    assert told == [pytest.approx(t0 + SYNC_PERIOD_S + 0.1)], "now() waited for the store"
    gate.opened.set()


def test_a_floor_the_store_raised_is_taken_up_by_the_next_readings(
    gated: tuple[GatedFloor, Quick],
) -> None:
    gate, q = gated
    gate.opened.set()
    wall = ManualClock(1_000_000.0)
    clock = SteadyClock(gate, gate.key, wall)  # type: ignore[arg-type]
    clock.now()
    # Another process, its clock an hour ahead, publishes its floor.
    ahead = SteadyClock(q.kv, gate.key, ManualClock(1_000_000.0 + 3600))
    ahead.now()
    wall.advance(SYNC_PERIOD_S + 0.1)
    clock.now()  # the exchange begins beside this reading
    deadline = time.monotonic() + 10
    while clock.now() < 1_000_000.0 + 3600 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert clock.now() >= 1_000_000.0 + 3600


def test_an_interrupt_inside_an_exchange_made_in_the_reading_reaches_its_caller() -> None:
    """On SQLite the reading that finds an exchange due makes it: a Ctrl-C in it must
    reach the caller as itself (not as a second release of the exchange's lock), and
    the next due reading exchanges again."""
    q = Quick.open("memory://")
    key = q.keys.meta_key("clock")
    interrupt = threading.Event()
    real = q.kv.create_transaction

    def create() -> KVTransaction:
        if interrupt.is_set():
            interrupt.clear()
            raise KeyboardInterrupt
        return real()

    q.kv.create_transaction = create  # type: ignore[method-assign]
    wall = ManualClock(1_000_000.0)
    clock = SteadyClock(q.kv, key, wall, beside=lambda run: run())
    clock.now()
    wall.advance(SYNC_PERIOD_S + 0.1)
    interrupt.set()
    with pytest.raises(KeyboardInterrupt):
        clock.now()
    clock.now()  # due still: exchanges, the lock free
    q.close()


pg = pytest.mark.skipif(postgres_skip_reason() is not None, reason=str(postgres_skip_reason()))


@pg
def test_an_enqueue_a_second_after_the_last_does_not_wait_on_the_clock_floor() -> None:
    """A user's complaint: on PostgreSQL an enqueue made once in a while hung while another
    session held the clock floor's row (a lock, a long exchange): it made the exchange
    itself, in its caller's thread."""
    import psycopg

    url = postgres_store_url()
    schema = url.rsplit("schema=", 1)[1]
    q = Quick.open(url)
    try:
        q.enqueue("job", {"n": 0}, app="a", tenant="t")  # the first exchange is made
        with psycopg.connect(shared_postgres_url()) as other:
            held = other.execute(
                f'SELECT key FROM "{schema}".kv WHERE key = %s FOR UPDATE',
                (q.keys.meta_key("clock"),),
            ).fetchall()
            assert held, "the floor's row is there to hold"
            time.sleep(SYNC_PERIOD_S + 0.1)
            done: list[str] = []
            enqueuer = threading.Thread(
                target=lambda: done.append(q.enqueue("job", {"n": 1}, app="a", tenant="t")),
                daemon=True,
            )
            enqueuer.start()
            enqueuer.join(15)
            finished = bool(done)
            other.rollback()  # the exchange may go on now
        enqueuer.join(15)
        assert finished, "the enqueue waited for the clock floor's row"
    finally:
        q.close()
