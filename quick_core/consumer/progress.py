"""Throttled progress writes for one running item (issue 31 point 4).

A handler may call ``ctx.progress`` in a tight loop; the store sees at most one write per
item per ``min_interval_s`` (0.5 s). A report inside that interval is held and written
when the interval ends (a timer) or when the handler returns (:meth:`close`, before the
item's completion reads the record), so the last report is always kept. A write that
fails (the lease lost, the store unreachable) is dropped: progress is advisory, and the
handler's own lease handling says what became of the item.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from quickzones.errors import QuickError
from quickzones.store.progress import check_progress

log = logging.getLogger("quick.consumer")

MIN_INTERVAL_S = 0.5

Write = Callable[[float, str | None], None]
# (delay_s, callback) -> a started timer that can be cancelled; None: no timer (tests).
TimerFactory = Callable[[float, Callable[[], None]], threading.Timer]


def _timer(delay_s: float, fn: Callable[[], None]) -> threading.Timer:
    t = threading.Timer(delay_s, fn)
    t.daemon = True
    t.start()
    return t


class ProgressReporter:
    """``ctx.progress`` of one item: validates, throttles, writes through ``write``."""

    def __init__(
        self,
        write: Write,
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        timer: TimerFactory | None = _timer,
    ) -> None:
        self._write = write
        self._interval = min_interval_s
        self._monotonic = monotonic
        self._timer_factory = timer
        self._lock = threading.Lock()
        self._last_write: float | None = None
        self._pending: tuple[float, str | None] | None = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def report(self, fraction: object, note: object = None) -> None:
        value = check_progress(fraction, note)  # a bad value raises in the handler
        with self._lock:
            if self._closed:
                return
            now = self._monotonic()
            if self._last_write is None or now - self._last_write >= self._interval:
                self._pending = None
                self._last_write = now
                due: tuple[float, str | None] | None = value
            else:
                self._pending = value
                due = None
                if self._timer is None and self._timer_factory is not None:
                    wait = self._interval - (now - self._last_write)
                    self._timer = self._timer_factory(wait, self._flush)
        if due is not None:
            self._send(due)

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            due, self._pending = self._pending, None
            if due is not None:
                self._last_write = self._monotonic()
        if due is not None:
            self._send(due)

    def close(self) -> None:
        """The handler returned: write a held report now, and nothing after."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            due, self._pending = self._pending, None
            self._closed = True
        if due is not None:
            self._send(due)

    def _send(self, value: tuple[float, str | None]) -> None:
        try:
            self._write(*value)
        except QuickError as err:
            log.debug("progress not recorded: %s", err)


def reporter_for(write: Write, in_transaction: bool) -> ProgressReporter:
    """A handler's reporter: throttled, or inside a transactional handler's transaction
    (its writes commit with the completion, so each is kept as it comes)."""
    if in_transaction:
        return ProgressReporter(write, min_interval_s=0.0, timer=None)
    return ProgressReporter(write)
