"""Batch enqueues (``POST .../batches``) take turns: a server writes at most
:data:`ITEMS_AT_ONCE` items of batches at a time, so each batch's one transaction runs
about as fast as it would alone.

A batch is one transaction (all or none), and a transaction must commit within the
store's 5 s lifetime. Writing 10,000 items is a second or two of Python on one core; eight
such batches at once in one process share the GIL (and, on SQLite, one write lock), so
each took eight times as long, outlived the lifetime and failed, all of them, and again
when retried (issue 41 point 5: 8 concurrent 10,000-item batches, 8 of 8 answered 503
after about 20 s). Taking turns costs nothing the store could have given: the GIL runs
one batch's Python at a time anyway. A batch that cannot start within
:data:`WAIT_S` (a queue of maximal batches longer than a client's timeout) is answered
503 ``busy`` with ``Retry-After``, before anything is written.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

# The most items one batch request may carry (the API's documented maximum), and the
# items a server writes at once: one maximal batch, or several smaller ones.
MAX_BATCH_ITEMS = 10_000
ITEMS_AT_ONCE = MAX_BATCH_ITEMS
# How long a batch waits for its turn: a queue of about eight maximal batches on a busy
# host, and below RemoteQuick's 30 s default timeout.
WAIT_S = 25.0
# What a batch refused its turn, or whose transaction outlived the lifetime, is told to
# wait before sending it again.
RETRY_AFTER_S = 5


class BatchTurns:
    """Admits batches of ``n`` items while at most ``items_at_once`` are being written,
    first come first served (a large batch is not overtaken for ever by small ones)."""

    def __init__(self, items_at_once: int = ITEMS_AT_ONCE, wait_s: float = WAIT_S) -> None:
        if items_at_once < 1 or not wait_s > 0:
            raise ValueError(f"items_at_once {items_at_once!r}, wait_s {wait_s!r}")
        self.items_at_once = items_at_once
        self.wait_s = wait_s
        self._writing = 0
        self._line: list[object] = []  # tickets of the batches waiting, oldest first
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def turn(self, n: int) -> Iterator[bool]:
        """Yields True once ``n`` items may be written (until the block ends), or False
        after ``wait_s`` without a turn (then write nothing)."""
        n = min(max(n, 1), self.items_at_once)  # a larger one waits for all the room
        ticket = object()
        deadline = time.monotonic() + self.wait_s
        with self._changed:
            self._line.append(ticket)
            admitted = self._changed.wait_for(
                lambda: self._line[0] is ticket and self._writing + n <= self.items_at_once,
                timeout=max(0.0, deadline - time.monotonic()),
            )
            self._line.remove(ticket)
            if admitted:
                self._writing += n
            self._changed.notify_all()  # the next in line may fit now, or be first
        try:
            yield admitted
        finally:
            if admitted:
                with self._changed:
                    self._writing -= n
                    self._changed.notify_all()
