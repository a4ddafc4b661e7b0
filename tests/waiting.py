"""Waiting for a condition in tests that run real threads and processes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``cond`` every 10 ms until it holds or ``timeout`` passes (generous: the
    machines are shared and slow); returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()
