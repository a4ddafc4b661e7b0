"""Consumer events: one named event per decision, counted, logged when it drops or delays
work, and passed to an optional observer (the metrics and the simulator's checks).

Shared by the scanner (Algorithm 1), managers (Algorithm 2), workers (Algorithm 3), the
completer and the lease extender; each emits through one :class:`Events`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from quickzones.store.records import ZoneId

log = logging.getLogger("quick.consumer")

# Consumer events that drop or delay work: each is logged once, at INFO, by name.
LOGGED_EVENTS = frozenset(
    {
        "dead_lettered",
        "requeued",
        "nacked",
        "throttled",
        "lease_lost",
        "released",
        "failed",
        "pointer_deleted",
        "dequeue_error",
        "requeue_error",
        "complete_error",
        # not "unknown_job_type": counted every time, logged once per type (routing.py)
    }
)
# ... and these at WARNING: work that will not run again unless an operator acts.
WARNING_EVENTS = frozenset({"dead_lettered"})

Observer = Callable[[str, dict[str, Any]], None]


class Events:
    """Counts, logs and reports a consumer's events."""

    def __init__(self, observer: Observer | None = None) -> None:
        self.observer = observer
        self.stats: Counter[str] = Counter()

    def emit(self, event: str, **fields: Any) -> None:
        self.stats[event] += 1
        if event in LOGGED_EVENTS:
            # One line per decision that drops or delays work, with a stable event name
            # and fields (never payloads) in ``extra`` for structured log handlers; a
            # zone is shown as its app and tenant, what an operator filters by.
            shown = _shown(fields)
            log.log(
                logging.WARNING if event in WARNING_EVENTS else logging.INFO,
                "%s %s",
                event,
                " ".join(f"{k}={v}" for k, v in shown.items()),
                extra={"quick_event": event, "quick_fields": shown},
            )
        if self.observer is not None:
            try:
                self.observer(event, fields)
            except Exception:  # an observer must never break the consumer
                log.exception("observer failed on %s", event)


def _shown(fields: dict[str, Any]) -> dict[str, str]:
    shown: dict[str, str] = {}
    for key, value in fields.items():
        if key == "zone" and isinstance(value, ZoneId):
            shown["app"], shown["tenant"] = value.app, value.tenant
        else:
            shown[key] = str(value)
    return shown
