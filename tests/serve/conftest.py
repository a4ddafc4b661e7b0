"""A real HTTP server (uvicorn on a free 127.0.0.1 port, in a thread) over a Quick on
memory://, sqlite:// and, where a FoundationDB build is present, a real fdb:// cluster,
with tokens for two apps."""

from __future__ import annotations

import contextlib
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx
import uvicorn

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.testing.provision.ports import free_port
from tests.conftest import HAVE_FDB, store_url

from .browser import launched_chromium


def signed_in(url: str, token: str) -> httpx.Client:
    """A dashboard client signed in with ``token`` (its session cookie set)."""
    client = httpx.Client(base_url=url)
    assert client.post("/login", data={"token": token}).status_code == 303
    return client


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


class CountingTransport(httpx.HTTPTransport):
    """A client transport that keeps the path of every request it sends (how many
    requests a remote worker or client makes, by route)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


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
    operator = tokens.create_for_all_apps(roles)[0]
    config = ConsumerConfig(min_inactive_s=0.5, one_transaction_visits=visits == "one-transaction")
    app = create_app(q, config=config, max_body=64 * 1024)
    try:
        with ServerThread(app) as server:
            yield Served(q, server.url, tokens, a_all, a_produce, b_all, operator)
    finally:
        q.close()


@contextlib.contextmanager
def serve_process(
    store: str, *options: str, open_files: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A real ``quick serve`` process on a free loopback port: its URL and process; stopped
    with SIGINT (as Ctrl-C) on the way out. ``open_files``: its limit of open files."""
    port = free_port()

    def limit_files() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    proc = subprocess.Popen(
        [sys.executable, "-m", "quickzones", "serve", "--store", store, "--port", str(port),
         "--log-level", "warning", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit_files,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v1/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "quick serve did not start"
            time.sleep(0.1)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (tests/serve/browser.py; its module calls require_chromium)."""
    yield from launched_chromium()
