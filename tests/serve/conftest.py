"""A real HTTP server (uvicorn on a free 127.0.0.1 port, in a thread) over a Quick on
memory://, sqlite:// and, where a FoundationDB build is present, a real fdb:// cluster,
with tokens for two apps."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

import uvicorn

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from tests.conftest import HAVE_FDB, store_url


class ServerThread:
    """uvicorn serving ``app`` on a socket bound to 127.0.0.1:0, in a daemon thread."""

    def __init__(self, app: object, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))  # a given port: the same server restarted
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on")  # type: ignore[arg-type]
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        self.sock.close()


@dataclass
class Served:
    q: Quick
    url: str
    tokens: TokenStore
    a_all: str  # app "a": produce, consume, admin
    a_produce: str  # app "a": produce only
    b_all: str  # app "b": every role
    operator: str  # every app, every role


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        # The pull path with one-transaction visits (ConsumerConfig.one_transaction_visits).
        "sqlite-one-transaction",
        *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else []),
    ]
)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    backend, _, visits = request.param.partition("-")
    q = Quick.open(store_url(backend, tmp_path))
    tokens = TokenStore(q.kv, q.keys, q.clock)
    roles = ["produce", "consume", "admin"]
    a_all = tokens.create("a", roles)[0]
    a_produce = tokens.create("a", ["produce"])[0]
    b_all = tokens.create("b", roles)[0]
    operator = tokens.create("*", roles)[0]
    config = ConsumerConfig(min_inactive_s=0.5, one_transaction_visits=visits == "one-transaction")
    app = create_app(q, config=config, max_body=64 * 1024)
    try:
        with ServerThread(app) as server:
            yield Served(q, server.url, tokens, a_all, a_produce, b_all, operator)
    finally:
        q.close()
