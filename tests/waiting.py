"""Waiting for a condition in tests that run real threads and processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Poll ``cond`` every 10 ms until it holds or ``timeout`` passes (generous: the
    machines are shared and slow); returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def returns_within(seconds: float, call: Callable[[], T]) -> T:
    """``call()`` on a thread of its own, its result or its error; fails the test if it
    has not returned after ``seconds`` (far past any honest answer: the faults this
    guards against are waits for another transaction, 10 s to a minute)."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = call()
        except BaseException as err:  # handed to the test
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in out:
        raise out["error"]
    return cast(T, out.get("value"))
