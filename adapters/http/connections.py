"""Slow clients: a connection must send its request's headers within ``header_timeout_s``
of connecting (or, kept alive, of the first byte of its next request), and a server
holds at most ``max_connections`` connections.

uvicorn times out only idle keep-alive connections, after a response; a client that
connects and sends half its headers (slowloris) is kept for ever, and enough of them
exhaust the process's file descriptors, so no one else is answered. :func:`guarded`
subclasses uvicorn's HTTP protocol (h11 or httptools, whichever it uses) to close such a
connection at its deadline; and a connection over the cap closes the oldest one still
waiting for its headers, so a client that sends a whole request gets in at once, or is
itself refused when every connection is busy with a request.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

log = logging.getLogger("quick.serve")

DEFAULT_HEADER_TIMEOUT_S = 10.0
CONNECTIONS_MAX = 4096
# The listen backlog, which is also how many connections asyncio accepts in one go before
# any of them is seen by the protocol (and so by the cap): uvicorn's 2,048 would let one
# burst run the process out of descriptors, and asyncio then retries accept() in a storm
# of errors that stalls the loop.
ACCEPT_BACKLOG = 128
_FILES_KEPT = 64  # descriptors left for the store, logs and the like


def default_max_connections() -> int:
    """At most CONNECTIONS_MAX, and below the process's open-file limit by an accept
    burst and a margin."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CONNECTIONS_MAX
    return max(16, min(CONNECTIONS_MAX, soft - _FILES_KEPT - ACCEPT_BACKLOG))


def guarded(base: type[asyncio.Protocol], header_timeout_s: float, max_connections: int) -> Any:
    """uvicorn's protocol class ``base`` with the header deadline and connection cap."""
    if not header_timeout_s > 0 or max_connections < 1:
        raise ValueError(
            f"header_timeout_s must be positive and max_connections at least 1, not "
            f"{header_timeout_s!r} and {max_connections!r}"
        )
    # Connections waiting for their request's headers, oldest first (dicts keep order).
    waiting: dict[Any, None] = {}
    held: set[Any] = set()

    class Guarded(base):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:
            if len(held) >= max_connections:
                oldest = next(iter(waiting), None)
                if oldest is None:  # every connection is busy with a request
                    log.warning("connection refused: %d connections open", len(held))
                    self._refused = True
                    transport.abort()
                    return
                oldest._close_slow(f"over the cap of {max_connections} connections")
            held.add(self)
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            idle = self.cycle is None or self.cycle.response_complete
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:
                self._disarm()  # a whole request's headers came
            elif idle and self._deadline is None:
                self._arm()  # the first bytes of a kept-alive connection's next request

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            held.discard(self)
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            waiting[self] = None
            self._deadline = self.loop.call_later(header_timeout_s, self._expired, self.cycle)

        def _disarm(self) -> None:
            waiting.pop(self, None)
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self, cycle: object) -> None:
            self._deadline = None
            if self.cycle is cycle:  # still no new request's headers
                self._close_slow(f"no request headers within {header_timeout_s:g} s")

        def _close_slow(self, why: str) -> None:
            self._disarm()
            held.discard(self)  # now: the abort's connection_lost comes a loop turn later
            log.info("closing a slow connection from %s: %s", self.client, why)
            if not self.transport.is_closing():
                self.transport.abort()  # its descriptor now, not after a lingering close

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
