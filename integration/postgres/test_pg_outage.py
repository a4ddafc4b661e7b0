"""With the PostgreSQL server down, a call gives up within the store's ``timeout_ms``,
connection attempts and retries included, and says the server refused the connection
(issue 41 point 7): ``q.enqueue`` blocked about 92 s against a 60 s timeout, then blamed
an overloaded store. The timeout here is small; the bound on each call is generous for a
shared machine and still far below what several full retry loops in a row took."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from quickzones.client import Quick
from quickzones.errors import StoreUnavailable
from quickzones.registry import JobContext
from quickzones.testing.provision.postgres import LocalPostgres, find_pg_bin, postgres_required

pytest.importorskip("psycopg")

TIMEOUT_MS = 3000
# What a call may take past its timeout on a loaded machine (one backoff, one attempt,
# scheduling); before, each of its transactions could take the whole timeout and more.
SLACK_S = 2.5


@pytest.fixture
def server() -> Iterator[LocalPostgres]:
    if find_pg_bin() is None:
        if postgres_required():
            pytest.fail("QUICK_REQUIRE_POSTGRES is set but there is no initdb", pytrace=False)
        pytest.skip("no PostgreSQL (initdb) here")
    pg = LocalPostgres().start()
    yield pg
    pg.close()


def _refused(err: StoreUnavailable, port: int) -> None:
    text = str(err)
    assert f"127.0.0.1:{port}" in text, text
    assert "refused" in text.lower(), text
    assert "overloaded" not in text.replace("not overloaded", ""), text
    assert err.retryable is False


def test_enqueue_with_the_server_down_gives_up_within_its_timeout(server: LocalPostgres) -> None:
    q = Quick.open(f"{server.url}?timeout_ms={TIMEOUT_MS}")
    try:
        ran: list[str] = []

        @q.job("t")
        def t(payload: object, ctx: JobContext) -> None:
            ran.append(str(payload))

        server.stop_immediate()
        for _ in range(2):  # the first call finds the outage, the second one in it
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                q.enqueue("t", "lost", app="a", tenant="b")
            took = time.monotonic() - started
            assert took < TIMEOUT_MS / 1000 + SLACK_S, f"enqueue took {took:.1f} s"
            _refused(caught.value, server.port)
        server.start()  # back: the next call connects again
        q.enqueue("t", "kept", app="a", tenant="b")
        assert q.run_until_idle() == 1 and ran == ["kept"]
    finally:
        q.close()


def test_opening_a_store_whose_server_is_down_names_it(server: LocalPostgres) -> None:
    url = f"{server.url}?timeout_ms={TIMEOUT_MS}"
    server.stop_immediate()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        Quick.open(url)
    assert time.monotonic() - started < TIMEOUT_MS / 1000 + SLACK_S
    _refused(caught.value, server.port)


def test_a_port_nobody_listens_on_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            Quick.open(f"postgresql://postgres@127.0.0.1:{port}/postgres?timeout_ms=1500")
        assert time.monotonic() - started < 1.5 + SLACK_S
        _refused(caught.value, port)


def _hung(port: int) -> socket.socket:
    """A socket on ``port`` that accepts connections and never answers (a hung server, a
    route that drops packets): libpq waits for the server's first message."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)  # the kernel completes the handshakes; nobody ever reads
    return sock


# libpq's shortest connect timeout: one try takes at least this long.
SHORTEST_CONNECT_S = 2.0


def test_opening_a_store_whose_server_never_answers_is_bounded_by_timeout_ms() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with _hung(port):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            Quick.open(f"postgresql://postgres@127.0.0.1:{port}/postgres?timeout_ms=1500")
        took = time.monotonic() - started
    assert took < SHORTEST_CONNECT_S + SLACK_S, f"opening took {took:.1f} s"
    assert f"127.0.0.1:{port}" in str(caught.value) and "timed out" in str(caught.value)


def test_enqueue_while_the_server_hangs_is_bounded_by_timeout_ms(server: LocalPostgres) -> None:
    q = Quick.open(f"{server.url}?timeout_ms=1500")
    try:

        @q.job("t")
        def t(payload: object, ctx: JobContext) -> None:
            pass

        server.stop_immediate()
        with _hung(server.port):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                q.enqueue("t", "lost", app="a", tenant="b")
            took = time.monotonic() - started
        assert took < SHORTEST_CONNECT_S + SLACK_S, f"enqueue took {took:.1f} s"
        assert "timed out" in str(caught.value)
    finally:
        q.close()
