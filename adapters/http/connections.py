"""Slow clients: a connection must send its request's headers within ``HEADER_TIMEOUT_S``
of connecting (or, kept alive, of the first byte of its next request), and a server
holds at most :attr:`Budget.connections` connections, derived with its long-poll limits
from the process's open-file limit (:meth:`Budget.of`).

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
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("quick.serve")

# Seconds a connection has to send its request's headers. A client's headers are one
# packet or a few: even a slow mobile link with a retransmission or two sends them in well
# under a second, so 10 s never closes an honest client, while a slowloris connection is
# closed and its descriptor freed within 10 s (the connection cap below bounds how many it
# can hold meanwhile). Not an option: no deployment has a reason to judge it otherwise.
HEADER_TIMEOUT_S = 10.0
CONNECTIONS_MAX = 4096
# The listen backlog, which is also how many connections asyncio accepts in one go before
# any of them is seen by the protocol (and so by the cap): uvicorn's 2,048 would let one
# burst run the process out of descriptors, and asyncio then retries accept() in a storm
# of errors that stalls the loop.
ACCEPT_BACKLOG = 128
_FILES_KEPT = 64  # descriptors left for the store, logs and the like


@dataclass(frozen=True, slots=True)
class Budget:
    """What one server holds open, all from its open-file limit: a connection and a long
    poll each hold a descriptor, and a process out of descriptors answers no one."""

    connections: int
    long_polls: int  # POST /v1/leases with wait_s > 0, open at once; more get 429
    long_polls_per_token: int  # of one token; more get 429

    @classmethod
    def of(cls, open_files: int | None = None) -> Budget:
        """The budget of a process allowed ``open_files`` descriptors (None: this one's
        soft RLIMIT_NOFILE). Connections: at most CONNECTIONS_MAX, below the limit by an
        accept burst and a margin. Long polls: a quarter of the connections, so the rest
        answer enqueues, health checks and the dashboard at once; of one token a quarter
        of those, so one client cannot hold them all. At 4,288 descriptors or more: 4,096
        connections, 1,024 polls, 256 of a token (the limits' fixed values before they
        were derived); at Linux's usual 1,024: 832, 208 and 52."""
        if open_files is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            open_files = None if soft == resource.RLIM_INFINITY else soft
        if open_files is None:
            connections = CONNECTIONS_MAX
        else:
            connections = max(16, min(CONNECTIONS_MAX, open_files - _FILES_KEPT - ACCEPT_BACKLOG))
        polls = max(1, connections // 4)
        return cls(connections, polls, max(1, polls // 4))


def guarded(
    base: type[asyncio.Protocol], max_connections: int, header_timeout_s: float = HEADER_TIMEOUT_S
) -> Any:
    """uvicorn's protocol class ``base`` with the header deadline and connection cap
    (``header_timeout_s``: a test's shorter deadline)."""
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
