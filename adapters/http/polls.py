"""How many long polls one server holds open: at most ``per_token`` for one token and
``total`` in all (from the process's open-file limit: ``connections.Budget``). A poll
over either limit is refused at once (429, ``too_many_polls``, Retry-After) rather than
queued, so one client cannot fill the server with waits and no client waits behind
another's.

The counts live on the event loop's thread (the lease route is a coroutine), so they need
no lock.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

RETRY_AFTER_S = 1  # what a refused poll is told to wait before asking again


class TooManyPolls(Exception):
    """A long poll over a limit; ``detail`` says which."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class PollLimits:
    def __init__(self, total: int, per_token: int) -> None:
        if total < 1 or per_token < 1:
            raise ValueError(f"poll limits must be at least 1, not {total} and {per_token}")
        self.total = total
        self.per_token = per_token
        self._open: Counter[str] = Counter()
        self._open_total = 0

    @property
    def open(self) -> int:
        """Long polls open now."""
        return self._open_total

    @contextlib.contextmanager
    def admit(self, token_id: str) -> Iterator[None]:
        """Hold one open poll of ``token_id`` while inside; :class:`TooManyPolls` over a
        limit."""
        if self._open[token_id] >= self.per_token:
            raise TooManyPolls(
                f"this token has {self.per_token} long polls open, its most; retry after "
                f"{RETRY_AFTER_S} s or ask with wait_s=0"
            )
        if self._open_total >= self.total:
            raise TooManyPolls(
                f"the server holds {self.total} long polls open, its most; retry after "
                f"{RETRY_AFTER_S} s"
            )
        self._open[token_id] += 1
        self._open_total += 1
        try:
            yield
        finally:
            self._open_total -= 1
            self._open[token_id] -= 1
            if not self._open[token_id]:
                del self._open[token_id]
