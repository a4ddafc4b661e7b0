"""A TCP proxy in front of a PostgreSQL server that, while told to, drops connections at
the worst moment: after the server got a request and answered it, before the answer
reaches the client. A COMMIT cut so committed, and the client cannot know
(``commit_unknown_result``); the fault no server-side one (a restart, a terminated
backend) produces but by chance."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from quickzones.testing.provision.ports import HOST

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


class ReplyCutter:
    """Listens on a port of its own and forwards to ``HOST:port``; while :meth:`cutting`,
    a chunk the server sends is, with probability ``p``, dropped with both sides of its
    connection instead of forwarded."""

    def __init__(self, port: int, seed: int = 5) -> None:
        self.target = port
        self.cut = 0  # connections dropped so, over the proxy's life
        self._p = 0.0
        self._holding: bytes | None = None
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, HOST, 0))
        ready.set()
        self._loop.run_forever()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(HOST, self.target)
        except OSError:
            client_w.close()
            return

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

    def close(self) -> None:
        def stop() -> None:
            if self._server is not None:
                self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)
