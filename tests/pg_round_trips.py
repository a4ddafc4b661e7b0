"""A TCP proxy in front of a PostgreSQL server that counts the round trips its clients
make: the requests that wait for the server's answer before the client goes on. In the
frontend protocol that is each ``Sync`` (the end of an extended-query pipeline, however
many statements it carries) and each simple ``Query``; the proxy reads the client's bytes
as the protocol frames them and forwards everything unchanged."""

from __future__ import annotations

import asyncio
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from tests.tcp_proxy import Ends, LoopbackProxy

# The startup packet has no type byte; every later frontend message is a type byte, then
# its length (itself included) as a big-endian int32.
_SYNC, _QUERY = ord("S"), ord("Q")
_SSL_REQUEST = 80877103


class RoundTripCounter(LoopbackProxy):
    """Forwards to ``HOST:port``; :attr:`round_trips` counts every client's Syncs and
    simple Queries since the proxy started (or since the last :meth:`reset`)."""

    def __init__(self, port: int) -> None:
        self.round_trips = 0
        self._lock = threading.Lock()
        super().__init__(port)

    def reset(self) -> int:
        """The count so far, and start again from 0."""
        with self._lock:
            count, self.round_trips = self.round_trips, 0
        return count

    async def forward(self, ends: Ends) -> None:
        client_r, client_w, server_r, server_w = (
            ends.client_r, ends.client_w, ends.server_r, ends.server_w
        )  # fmt: skip

        async def answers() -> None:
            try:
                while chunk := await server_r.read(65536):
                    client_w.write(chunk)
                    await client_w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                client_w.close()

        back = asyncio.ensure_future(answers())
        try:
            await self._requests(client_r, server_w)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            server_w.close()
            await back

    async def _requests(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        # The startup packet (after an SSL request, if any: answered by the server's one
        # byte, which the other direction forwards).
        while True:
            head = await r.readexactly(8)
            length, code = struct.unpack("!ii", head)
            w.write(head + await r.readexactly(length - 8))
            await w.drain()
            if code != _SSL_REQUEST:
                break
        while True:
            head = await r.readexactly(5)
            kind = head[0]
            (length,) = struct.unpack("!i", head[1:])
            w.write(head + await r.readexactly(length - 4))
            if kind in (_SYNC, _QUERY):
                with self._lock:
                    self.round_trips += 1
                await w.drain()


def traced_round_trips(store: Any, call: Callable[[], object]) -> int:
    """The requests ``call`` sent on ``store``'s pooled connections (a ``PostgresStore``),
    from libpq's trace: each pipeline's Sync and each simple Query. An answer read late
    (a ROLLBACK the last transaction sent) is no request of ``call``'s. Fails if ``call``
    opened a connection (its requests would go uncounted)."""
    conns = list(store._pool)
    with tempfile.TemporaryFile("w+") as trace:
        for conn in conns:
            conn.pgconn.trace(trace.fileno())
        call()
        for conn in conns:
            conn.pgconn.untrace()
        assert list(store._pool) == conns, "a connection was opened meanwhile"
        trace.seek(0)
        return sum("\tF\t" in line and ("\tSync" in line or "\tQuery\t" in line) for line in trace)
