"""Slow clients: a connection must send its request's headers within ``HEADER_TIMEOUT_S``
of connecting (or, kept alive, of the first byte of its next request), then its body at
a pace (:data:`BODY_TIMEOUT_S`, :data:`BODY_MIN_RATE`) and within ``max_body`` bytes; and
a server holds at most :attr:`Budget.connections` connections, derived with its long-poll
limits from the process's open-file limit (:meth:`Budget.of`).

uvicorn times out only idle keep-alive connections, after a response; a client that
connects and sends half its headers (slowloris), or whole headers and then a body a byte
a second, is kept for ever, and enough of them exhaust the connections, so no one else
is answered. :func:`guarded` subclasses uvicorn's HTTP protocol (h11 or httptools,
whichever it uses) to close such a connection at its deadline; and a connection over the
cap closes the oldest one still waiting for its headers, else the oldest still sending a
body without a token the server has admitted, so a client that sends a whole request (a
health check, an enqueue with its token) gets in at once, or is itself refused when every
connection is busy with a request or a known token's body.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("quick.serve")

# Seconds a connection has to send its request's headers. A client's headers are one
# packet or a few: even a slow mobile link with a retransmission or two sends them in well
# under a second, so 10 s never closes an honest client, while a slowloris connection is
# closed and its descriptor freed within 10 s (the connection cap below bounds how many it
# can hold meanwhile). Not an option: no deployment has a reason to judge it otherwise.
HEADER_TIMEOUT_S = 10.0
# A request's body must arrive within BODY_TIMEOUT_S of its headers, plus one second for
# every BODY_MIN_RATE bytes received: a client must average about 4 KiB/s (32 kbit/s,
# a poor mobile link), after a grace for a slow start, so an honest upload of the largest
# body (4 MiB by default) is never cut while a client trickling a byte a second is closed
# after 10 s. As Apache's mod_reqtimeout (body=..., MinRate=...). Not an option either.
BODY_TIMEOUT_S = 10.0
BODY_MIN_RATE = 4096.0
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


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The bearer token of a request's headers (uvicorn lowercases their names)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def guarded(
    base: type[asyncio.Protocol],
    max_connections: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    *,
    max_body: int | None = None,
    admitted: Callable[[str], bool] | None = None,
) -> Any:
    """uvicorn's protocol class ``base`` with the header and body deadlines, the body cap
    (``max_body`` bytes; None: none here) and the connection cap. ``admitted(token)``:
    whether a bearer token is known valid (:meth:`TokenStore.admitted`; None: none is),
    which puts its connection after the others in line to be closed when the server is
    full. ``header_timeout_s``: a test's shorter deadline. A body's deadline is
    ``BODY_TIMEOUT_S`` plus a second per ``BODY_MIN_RATE`` bytes received."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be positive, not {header_timeout_s!r}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, not {max_connections!r}")
    # Connections waiting for their request's headers, oldest first (dicts keep order),
    # and those sending a body without an admitted token: the first closed when full.
    waiting: dict[Any, None] = {}
    unknown_bodies: dict[Any, None] = {}
    held: set[Any] = set()

    class Guarded(base):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None
        _refused = False
        _body_cycle: Any = None  # uvicorn's cycle of the request whose body is awaited
        _body_started = 0.0
        _body_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:
            if len(held) >= max_connections:
                victim = next(iter(waiting), None) or next(iter(unknown_bodies), None)
                if victim is None:  # every connection is busy with a request
                    log.warning("connection refused: %d connections open", len(held))
                    self._refused = True
                    transport.abort()
                    return
                victim._close_slow(f"over the cap of {max_connections} connections")
            held.add(self)
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            idle = self.cycle is None or self.cycle.response_complete
            before = self.cycle
            receiving = self._body_cycle is not None and self._body_cycle is before
            super().data_received(data)
            if self.transport.is_closing():
                return
            if self.cycle is not before:
                self._disarm()  # a whole request's headers came
                self._await_body(data)
            elif receiving:
                self._body_bytes += len(data)
                self._body_check()
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
            unknown_bodies.pop(self, None)
            self._body_cycle = None
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self, cycle: object) -> None:
            self._deadline = None
            if self.cycle is cycle:  # still no new request's headers
                self._close_slow(f"no request headers within {header_timeout_s:g} s")

        # --- the body ------------------------------------------------------------------

        def _await_body(self, data: bytes) -> None:
            """The headers of a new request came (in ``data``, with perhaps some of its
            body): until its body has come whole, it runs against the body deadline."""
            cycle = self.cycle
            if cycle is None or not cycle.more_body:
                return  # no body, or all of it came with the headers
            self._body_cycle = cycle
            self._body_started = self.loop.time()
            self._body_bytes = len(cycle.body)
            token = _bearer(cycle.scope.get("headers", []))
            if token is None or admitted is None or not admitted(token):
                unknown_bodies[self] = None
            self._body_check()

        def _body_check(self) -> None:
            """Close the connection past its body's cap or deadline; else, once the body
            came whole, stop watching it; else (re)arm the deadline."""
            cycle = self._body_cycle
            if cycle is None or cycle is not self.cycle:
                return
            if max_body is not None and self._body_bytes > max_body and cycle.response_complete:
                # Its 413 went out (BodyLimit's, which a closed connection would lose):
                # the rest of the body is not read for nothing.
                self._close_slow(f"a request body over {max_body} bytes")
                return
            if not cycle.more_body:
                self._disarm()
                return
            allowed = BODY_TIMEOUT_S + self._body_bytes / BODY_MIN_RATE
            left = self._body_started + allowed - self.loop.time()
            if left <= 0:
                self._close_slow(
                    f"its request body came slower than {BODY_MIN_RATE:g} bytes/s "
                    f"after {BODY_TIMEOUT_S:g} s"
                )
                return
            if self._deadline is None:
                self._deadline = self.loop.call_later(left, self._body_expired)

        def _body_expired(self) -> None:
            self._deadline = None
            self._body_check()  # re-armed for the rest if bytes came meanwhile

        def _close_slow(self, why: str) -> None:
            self._disarm()
            held.discard(self)  # now: the abort's connection_lost comes a loop turn later
            log.info("closing a slow connection from %s: %s", self.client, why)
            if not self.transport.is_closing():
                self.transport.abort()  # its descriptor now, not after a lingering close

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
