"""A TCP proxy in front of a PostgreSQL server that, while told to, drops connections at
the worst moment: after the server got a request and answered it, before the answer
reaches the client. A COMMIT cut so committed, and the client cannot know
(``commit_unknown_result``); the fault no server-side one (a restart, a terminated
backend) produces but by chance."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager

from tests.tcp_proxy import Ends, LoopbackProxy

# The server's CommandComplete for a COMMIT: sent once the transaction committed.
COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"


# How long a cut connection's server side is kept open, its answers discarded.
SERVER_GRACE_S = 0.3


async def _discard(r: asyncio.StreamReader, seconds: float) -> None:
    async def read_all() -> None:
        while await r.read(65536):
            pass

    try:
        await asyncio.wait_for(read_all(), seconds)
    except (TimeoutError, ConnectionError, OSError):
        pass


class ReplyCutter(LoopbackProxy):
    """Listens on a port of its own and forwards to ``HOST:port``; while :meth:`cutting`,
    a chunk the server sends is, with probability ``p``, dropped with both sides of its
    connection instead of forwarded."""

    def __init__(self, port: int, seed: int = 5) -> None:
        self.cut = 0  # connections dropped so, over the proxy's life
        self._p = 0.0
        self._holding: bytes | None = None
        self._rng = random.Random(seed)
        super().__init__(port)

    async def forward(self, ends: Ends) -> None:
        client_r, client_w, server_r, server_w = (
            ends.client_r, ends.client_w, ends.server_r, ends.server_w
        )  # fmt: skip
        cut = asyncio.Event()

        def drop() -> None:
            client_w.transport.abort()
            if not cut.is_set():  # a cut connection's server side ends on its own
                server_w.transport.abort()

        def cut_now(answers: bool, chunk: bytes) -> bool:
            if not answers or not self._p:
                return False
            return (self._holding is None or self._holding in chunk) and (
                self._rng.random() < self._p
            )

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, answers: bool) -> None:
            try:
                while chunk := await r.read(65536):
                    if cut_now(answers, chunk):
                        self.cut += 1
                        cut.set()
                        client_w.transport.abort()  # the answer is lost
                        # The server still carries out what it was sent (the rest of a
                        # pipeline: a COMMIT after the one whose answer held COMMITTED).
                        await _discard(r, SERVER_GRACE_S)
                        server_w.transport.abort()
                        return
                    w.write(chunk)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            drop()

        await asyncio.gather(
            pump(client_r, server_w, answers=False), pump(server_r, client_w, answers=True)
        )

    @contextmanager
    def cutting(self, p: float, holding: bytes | None = None) -> Iterator[None]:
        """Cut answers with probability ``p`` each until the block ends; with ``holding``,
        only answers that hold it (:data:`COMMITTED`: the server says a COMMIT is done)."""
        self._p, self._holding = p, holding
        try:
            yield
        finally:
            self._p, self._holding = 0.0, None
