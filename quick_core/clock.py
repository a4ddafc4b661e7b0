"""The clock seam: consumers, zones and the simulator all read time through it.

Times stored in keys are integer milliseconds since the epoch, so every backend orders
them the same way and the tuple layer packs them compactly.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time in seconds and a way to wait."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


def now_ms(clock: Clock) -> int:
    """The clock's time in integer milliseconds, the unit of every stored time."""
    return int(clock.now() * 1000)


class SystemClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told; ``sleep`` advances it instead of waiting.

    Thread-safe so a test can advance it while consumer threads read it.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def set(self, when: float) -> None:
        with self._lock:
            self._now = when
