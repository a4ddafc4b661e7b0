"""A failure that repeats many times a second (a full store, an unreachable server):
logged once per interval with how often it happened, never a record per occurrence, and
the capped backoff to wait before the next try.

A full disk made ``quick worker`` retry its visits at once and log each with a
traceback: about 1,000 records a second (issue 28, point 5). The count keeps what the
log leaves out: nothing is silently lost.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable


def backoff(attempt: int, base_s: float = 0.1, cap_s: float = 5.0, *, least: float = 0.0) -> float:
    """Seconds to wait after ``attempt`` failures in a row: exponential, at most
    ``cap_s``, with full jitter (processes failing together do not retry together), or,
    with ``least``, at least that fraction of the step (a zone set aside is never
    retried at once)."""
    step = min(cap_s, base_s * 2 ** min(attempt, 32))
    return random.uniform(least * step, step)


class RepeatedFailure:
    """Logs one kind of failure (``what``, e.g. "manager visits") at most once per
    ``interval_s``: the first with its error, later ones with how many failures the
    interval saw, and, once it succeeds again, one line saying so with the total.
    ``failures`` counts the failures in a row (for :func:`backoff`). ``failing`` and
    ``recovered`` say what the first and the last line say ("quick serve at ... is
    unreachable"). Thread-safe."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        interval_s: float = 10.0,
        level: int = logging.ERROR,
        monotonic: Callable[[], float] = time.monotonic,
        failing: str | None = None,
        recovered: str | None = None,
    ) -> None:
        self.logger = logger
        self.what = what
        self.failing = failing or f"{what} failed"
        self.recovered = recovered or f"{what} succeed again"
        self.interval_s = interval_s
        self.level = level
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.failures = 0  # in a row
        self._since_logged = 0  # failures not yet in a log record
        self._logged_at: float | None = None  # when a failure was last logged
        self._streak_started = 0.0
        self._told = False  # a failure of this streak was logged: say when it ends

    def failed(self, err: BaseException) -> int:
        """Count one failure; log it if the interval allows. Returns the failures in a row."""
        now = self._monotonic()
        with self._lock:
            if self.failures == 0:
                self._streak_started = now
            self.failures += 1
            self._since_logged += 1
            if self._logged_at is not None and now - self._logged_at < self.interval_s:
                return self.failures
            count, self._since_logged, self._logged_at = self._since_logged, 0, now
            first = not self._told
            self._told = True
            failures = self.failures
        error = f"{type(err).__name__}: {err}"
        if first:
            self.logger.log(
                self.level,
                "%s: %s (retried with backoff; logged again at most every %g s, with a count)",
                self.failing,
                error,
                self.interval_s,
            )
        else:
            self.logger.log(
                self.level,
                "%s failed %d times in the last %g s (%d in a row); the last: %s",
                self.what,
                count,
                self.interval_s,
                failures,
                error,
            )
        return failures

    def succeeded(self) -> None:
        """The operation worked: ends a streak of failures (logged if it was)."""
        if self.failures == 0:  # the common case, without the lock
            return
        now = self._monotonic()
        with self._lock:
            failures, self.failures = self.failures, 0
            told, self._told = self._told, False
            self._since_logged = 0
            lasted = now - self._streak_started
        if told and failures:
            self.logger.warning(
                "%s after %d failures in a row over %.1f s",
                self.recovered,
                failures,
                lasted,
            )
