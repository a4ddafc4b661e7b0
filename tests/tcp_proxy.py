"""A TCP proxy on 127.0.0.1 in front of a server the tests run: the event loop, the
listening port and the connection to the server, for proxies that differ only in what
they do with the bytes of each connection (:meth:`LoopbackProxy.forward`)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from quickzones.testing.provision.ports import HOST


@dataclass(slots=True)
class Ends:
    """One proxied connection: the client's side and the server's."""

    client_r: asyncio.StreamReader
    client_w: asyncio.StreamWriter
    server_r: asyncio.StreamReader
    server_w: asyncio.StreamWriter


class LoopbackProxy:
    """Listens on a port of its own (:attr:`port`) and forwards each connection to
    ``HOST:port`` through :meth:`forward`, on an event loop of its own thread."""

    def __init__(self, port: int) -> None:
        self.target = port
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
        await self.forward(Ends(client_r, client_w, server_r, server_w))

    async def forward(self, ends: Ends) -> None:
        """Carry one connection's bytes both ways until either side ends it."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop listening and end every connection still open through the proxy."""

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(10)
