"""A ``threading.Event`` made only when someone waits on it.

Every held item carries two events (``Work.cancelled``, ``Running.lease_lost``) that are
almost never set and almost never waited on: a handler reads them with ``is_set()``, if at
all. A ``threading.Event`` builds a ``Condition`` and a lock as it is made, which was a
tenth of a no-op worker's per-item CPU outside the store (issue 29 point 3); this flag
builds one only for a caller of :meth:`wait`.
"""

from __future__ import annotations

import threading

# Serialises only the first wait on each flag (the making of its event): rare.
_MAKING = threading.Lock()


class Flag:
    """``threading.Event``'s interface (``is_set``, ``set``, ``clear``, ``wait``)."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        # The flag first, then the event: a waiter makes its event before it reads the
        # flag, so either it sees the flag or this sees its event (no wake-up is lost).
        self._set = True
        event = self._event
        if event is not None:
            event.set()

    def clear(self) -> None:
        self._set = False
        event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        event = self._event
        if event is None:
            with _MAKING:
                if self._event is None:
                    self._event = threading.Event()
                event = self._event
        if self._set:
            event.set()  # set before its event was made
        return event.wait(timeout)
