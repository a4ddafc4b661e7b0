"""The clock seam: consumers, zones and the simulator all read time through it.

Times stored in keys are integer milliseconds since the epoch, so every backend orders
them the same way and the tuple layer packs them compactly.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


class Clock(Protocol):
    """Wall time in seconds and a way to wait."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


@runtime_checkable
class ElapsedClock(Clock, Protocol):
    """A clock that also measures elapsed time, which no step of the wall clock changes.

    :class:`~quickzones.store.steady_clock.SteadyClock` needs one to tell time that passed from
    a wall clock that was set back.
    """

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never decreases, ignores wall-clock steps."""
        ...


def now_ms(clock: Clock) -> int:
    """The clock's time in integer milliseconds, the unit of every stored time."""
    return int(clock.now() * 1000)


def ms_up(seconds: float) -> int:
    """``seconds`` in whole milliseconds, rounded up: a time that must not come early (a
    delayed item's vesting time) is never stored before it. A float error under a
    microsecond (``1.1 * 1000``) does not round up."""
    return math.ceil(seconds * 1000 - 0.001)


def vesting_after(clock: Clock, delay_ms: float) -> int:
    """When an item delayed by ``delay_ms`` from now vests, in store milliseconds: the
    clock's reading plus the delay, rounded up, so that a delayed enqueue, a retry's
    backoff or a nack's delay never ends early (the truncated reading would lose up to a
    millisecond); with no delay, now. Every zone store computes its delays here."""
    if delay_ms <= 0:
        return now_ms(clock)
    return ms_up(clock.now() + delay_ms / 1000)


def now_reader(clock: Clock) -> Callable[[], float]:
    """``clock.now``; for the system clock ``time.time`` itself, the same reading without
    a Python call between (a store's transaction reads the time a dozen times a commit)."""
    return time.time if type(clock) is SystemClock else clock.now


class SystemClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told; ``sleep`` advances it instead of waiting.

    Time passing (``advance``, ``sleep``) moves both the wall reading and :meth:`monotonic`;
    a step of the wall clock (``step_back``, ``set``), as when an administrator or NTP sets
    the time, moves only the wall reading.
    Thread-safe so a test can advance it while consumer threads read it.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._elapsed = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (a negative value steps the wall clock back instead)."""
        with self._lock:
            self._now += seconds
            self._elapsed += max(0.0, seconds)

    def step_back(self, seconds: float) -> None:
        """Set the wall clock ``seconds`` earlier without any time passing."""
        with self._lock:
            self._now -= abs(seconds)

    def set(self, when: float) -> None:
        """Set the wall clock, as an administrator would: no time passes."""
        with self._lock:
            self._now = when
