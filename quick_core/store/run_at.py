"""When an enqueued item should run: a delay (seconds or a ``timedelta``) or an absolute
``run_at`` time, turned into the one delay in seconds the store keeps (its vesting time is
the store's clock plus that delay)."""

from __future__ import annotations

from datetime import datetime, timedelta

from quickzones.errors import InvalidArgument
from quickzones.store.validation import check_seconds


def delay_seconds(delay: object, run_at: object, now_s: float) -> float:
    """Seconds from ``now_s`` (the Quick's clock) until the item should run.

    ``delay``: seconds (int or float) or a ``timedelta``; ``run_at``: a timezone-aware
    ``datetime`` (a naive one names no instant: refused), not both. A ``run_at`` already
    past means now: the item runs at once, as with no delay."""
    if run_at is None:
        if isinstance(delay, timedelta):
            return check_seconds("delay", delay.total_seconds())
        return check_seconds("delay", delay)
    if not (delay is None or (isinstance(delay, int | float) and delay == 0)):
        raise InvalidArgument("run_at", run_at, "give run_at or delay, not both")
    if not isinstance(run_at, datetime):
        raise InvalidArgument(
            "run_at", run_at, "must be a datetime (from an ISO 8601 string: datetime.fromisoformat)"
        )
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidArgument(
            "run_at",
            run_at,
            "must be timezone-aware (e.g. datetime.now(timezone.utc) + timedelta(hours=1)); "
            "a naive time names no instant",
        )
    return check_seconds("run_at", max(0.0, run_at.timestamp() - now_s))
