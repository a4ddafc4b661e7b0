"""What a plain enqueue sends on PostgreSQL (issue 42): its reads in one write and its commit
in another (each statement of a round trip went out in a write of its own through psycopg's
pipeline, and its parameters were dumped by psycopg: most of the call's client CPU), and
the statements sent so (``backends/postgres/wire.py``, parameters packed in binary) carry
any bytes, through quick's own connections and through an application's."""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from quickzones.client import Quick
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


class WriteCounter:
    """A TCP proxy to the tests' server that counts the chunks clients send it: one per
    write a client makes, or fewer when writes arrive together (never more, for the
    few-hundred-byte messages here)."""

    def __init__(self, host: str, port: int) -> None:
        self.writes = 0
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        while not self._stop:
            for key, _ in sel.select(0.1):
                if key.data is None:
                    client, _ = self._listener.accept()
                    server = socket.create_connection(self._target)
                    for s in (client, server):
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sel.register(client, selectors.EVENT_READ, (server, True))
                    sel.register(server, selectors.EVENT_READ, (client, False))
                    continue
                peer, from_client = key.data
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(1 << 20)
                    if chunk:
                        self.writes += from_client
                        peer.sendall(chunk)
                except OSError:
                    chunk = b""
                if not chunk:  # either side gone: both go
                    for s in (sock, peer):
                        if s.fileno() >= 0:
                            sel.unregister(s)
                            s.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self._listener.close()


@pytest.fixture
def counted() -> Iterator[tuple[WriteCounter, str]]:
    url = postgres_store_url()
    parts = urlsplit(url)
    proxy = WriteCounter(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    proxied = (netloc[0] + "@" + host) if len(netloc) == 2 else host
    yield proxy, urlunsplit(parts._replace(netloc=proxied))
    proxy.close()


def _counted_quick(url: str) -> Quick:
    """A Quick whose every write to the server is an enqueue's: no NOTIFY, and no steady
    clock's exchange beside the enqueues (one a second: a test slowed by a loaded host
    counted it, CI)."""
    listen_off = f"{url}&listen=off" if "?" in url else f"{url}?listen=off"
    return Quick.open(listen_off, steady_clock=False)


def test_a_plain_enqueue_is_two_writes_to_the_server(counted: tuple[WriteCounter, str]) -> None:
    proxy, url = counted
    q = _counted_quick(url)
    try:
        q.enqueue("job", {"n": 0}, app="a", tenant="t")  # the zone and its pointer
        q.enqueue("job", {"n": 1}, app="a", tenant="t")  # the store's connection made
        before = proxy.writes
        for n in range(20):
            q.enqueue("job", {"n": n}, app="a", tenant="t")
        per_call = (proxy.writes - before) / 20
        # The reads (BEGIN, the snapshot, the index entry and layout) in one write, the
        # commit (its end of the snapshot, quick_commit3, COMMIT, part two's look at the
        # pointer) in another; psycopg's pipeline wrote each statement apart (10).
        assert per_call <= 2
        assert q.status("a", "t", q.enqueue("job", {"n": 99}, app="a", tenant="t")) is not None
    finally:
        q.close()


def test_an_enqueue_into_a_zone_enqueued_into_before_is_one_write(
    counted: tuple[WriteCounter, str],
) -> None:
    """Issue 42's 1.5x procrastinate: part one's reads (the layout and the zone's index
    entry) are answered from what this store read after its last commit into the zone,
    and its commit checks them against the snapshot they were read in: BEGIN,
    quick_commit3, COMMIT and part two's look at the pointer go out in one write."""
    proxy, url = counted
    q = _counted_quick(url)
    try:
        q.enqueue("job", {"n": 0}, app="a", tenant="t")  # the zone and its pointer
        q.enqueue("job", {"n": 1}, app="a", tenant="t")  # reads the zone's entry itself
        before = proxy.writes
        for n in range(20):
            q.enqueue("job", {"n": n}, app="a", tenant="t")
        assert (proxy.writes - before) / 20 <= 1
        assert q.status("a", "t", q.enqueue("job", {"n": 99}, app="a", tenant="t")) is not None
    finally:
        q.close()


AWKWARD = [
    b"",
    b"\x00",
    b"\x00\xff\x00",
    bytes(range(256)),
    "Ünïcødé 名前".encode(),
    b"\\x00 '\" %s $1",
]


def test_awkward_bytes_round_trip_through_the_store_and_an_application() -> None:
    import psycopg

    from quickzones.backends.postgres import PostgresStore

    url = postgres_store_url()
    store = PostgresStore.from_url(url)
    try:
        keys = [b"k" + bytes([i]) + value for i, value in enumerate(AWKWARD)]
        many = [b"m" + i.to_bytes(2, "big") for i in range(1500)]  # past KEYS_PER_SELECT

        def write(tr: object) -> None:
            for key, value in zip(keys, AWKWARD, strict=True):
                tr.set(key, value)  # type: ignore[attr-defined]
            for key in many:
                tr.set(key, key * 3)  # type: ignore[attr-defined]

        from quickzones.store.kv import run

        run(store, write)

        def read(tr: object) -> tuple[object, ...]:
            get, get_many = tr.get, tr.get_many  # type: ignore[attr-defined]
            get_range = tr.get_range  # type: ignore[attr-defined]
            return (
                [get(key) for key in keys],
                get_many([*many, b"absent"]),
                get_range(b"k", b"l"),
                get_range(b"m", b"n", limit=3, reverse=True),
                get_range(b"m", b"n", limit=0),
            )

        ones, found, forward, last3, every = run(store, read)
        assert ones == AWKWARD
        assert found == [key * 3 for key in many] + [None]
        assert [v for _, v in forward] == AWKWARD
        assert [k for k, _ in last3] == many[-1:-4:-1]
        assert len(every) == len(many)
        # The same through an application's own connection, inside its transaction.
        conninfo = store.conninfo
        with psycopg.connect(conninfo) as conn:
            with store.transaction_on(conn) as tr:
                assert [tr.get(key) for key in keys] == AWKWARD
                assert tr.get_many(many[:3]) == [key * 3 for key in many[:3]]
                assert [v for _, v in tr.get_range(b"k", b"l")] == AWKWARD
                tr.set(b"app\x00\xff", b"\x00written\xff")
            conn.commit()
        assert run(store, lambda tr: tr.get(b"app\x00\xff")) == b"\x00written\xff"
    finally:
        store.close()


def test_quicks_own_connections_prepare_each_statement_once_and_applications_never() -> None:
    """A statement with parameters is parsed and planned once per connection of the
    store's own (an unnamed one cost the server each time: about 150 us of a plain
    enqueue's 620); an application's connection, the application's session, gets none."""
    import psycopg

    url = postgres_store_url()
    with Quick.open(url) as q:
        kv: Any = q.kv

        def prepared() -> set[str]:
            conn = kv._acquire()
            try:
                return {r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements")}
            finally:
                kv._release(conn)

        for n in range(5):
            q.enqueue("j", {"n": n}, app="a", tenant="t")
        names = prepared()
        assert names and all(name.startswith("quick_") for name in names), names
        for n in range(5):
            q.enqueue("j", {"n": n}, app="a", tenant="t")
        assert prepared() == names  # each reused, none prepared again
        server = urlsplit(url)
        app_url = urlunsplit((server.scheme, server.netloc, server.path, "", ""))
        with psycopg.connect(app_url) as app:
            with app.transaction():
                q.enqueue_on(app, "j", b"", app="a", tenant="u")
            assert app.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


@pytest.fixture()
def enrolled() -> Iterator[tuple[Any, Any]]:
    """A connection of the store's own kind (autocommit, psycopg's preparing off) with a
    temporary table ``t (n int)``, enrolled to prepare its statements: it and its
    :class:`~quickzones.backends.postgres.wire.Preparing`."""
    import psycopg

    from quickzones.backends.postgres import wire

    server = urlsplit(postgres_store_url())
    conn = psycopg.connect(
        urlunsplit((server.scheme, server.netloc, server.path, "", "")),
        autocommit=True,
        prepare_threshold=None,
    )
    try:
        conn.execute("CREATE TEMP TABLE t (n int)")
        preparing = wire.Preparing(True, "test store")
        wire.enroll(conn, preparing)
        yield conn, preparing
    finally:
        conn.close()


def test_a_prepared_statement_lost_after_the_commit_leaves_the_commit_and_stops_preparing(
    enrolled: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A pooler handing the connection another server session shows as a prepared
    statement the server does not know. Before a COMMIT it fails the round trip
    retryably; after it (the reads quick makes with a commit's answer), the commit stands
    and those reads come back empty. Either way the store prepares nothing more, said
    once in the log."""
    import logging

    from quickzones.backends.postgres import wire

    caplog.set_level(logging.WARNING, logger="quick.postgres")
    conn, preparing = enrolled
    select = (b"SELECT count(*) FROM t WHERE n >= $1", [wire.int4(0)], False)
    insert = (b"INSERT INTO t VALUES ($1)", [wire.int4(1)], False)
    assert wire.exchange(conn, [select])[0].fetchone() == (b"0",)
    conn.execute("DEALLOCATE ALL")  # what another server session looks like
    batch = [wire.plain("BEGIN"), insert, wire.plain("COMMIT"), select]
    rows = wire.exchange(conn, batch, soft_from=3)
    assert rows[-1].failed and rows[-1].fetchall() == []
    assert not preparing.on
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)  # committed once
    # From now on nothing more is prepared, and nothing fails.
    count = "SELECT count(*) FROM pg_prepared_statements"
    before = conn.execute(count).fetchone()
    other = (b"SELECT count(*) FROM t WHERE n < $1", [wire.int4(9)], False)
    assert wire.exchange(conn, [insert, other])[1].fetchone() == (b"2",)
    assert conn.execute(count).fetchone() == before
    said = [r.getMessage() for r in caplog.records if "unprepared" in r.getMessage()]
    assert len(said) == 1 and "test store" in said[0], said


def test_a_prepared_statement_lost_before_the_commit_fails_retryably(
    enrolled: tuple[Any, Any],
) -> None:
    import psycopg

    from quickzones.backends.postgres import wire
    from quickzones.backends.postgres.errors import translate
    from quickzones.store.kv import NOT_COMMITTED

    conn, preparing = enrolled
    insert = (b"INSERT INTO t VALUES ($1)", [wire.int4(1)], False)
    wire.exchange(conn, [insert])
    conn.execute("DEALLOCATE ALL")
    with pytest.raises(psycopg.Error) as caught:
        wire.exchange(conn, [wire.plain("BEGIN"), insert, wire.plain("COMMIT")])
    conn.execute("ROLLBACK")
    failure = translate(caught.value, "commit")
    assert getattr(failure, "code", None) == NOT_COMMITTED and failure.retryable
    assert not preparing.on
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)  # only the first


def test_native_statements_keep_psycopgs_notation_and_python_values() -> None:
    """The native zones' statements go through ``native_session`` as psycopg would run
    them: named and positional parameters (a name used twice is one parameter), ``%%``
    a literal percent, each value back as psycopg reads it, a write's row count, and an
    error raised by the result that reads it, nothing sent before a read."""
    import psycopg

    from quickzones.backends.postgres import wire
    from quickzones.backends.postgres.native_session import WireSession

    server = postgres_store_url().split("?")[0]
    with psycopg.connect(server, autocommit=True, prepare_threshold=None) as conn:
        wire.enroll(conn, wire.Preparing(True, "test"))
        s = WireSession(conn)
        s.execute("BEGIN")
        s.execute("CREATE TEMP TABLE t (k text, n bigint, b bytea, f boolean)")
        s.execute(
            "INSERT INTO t VALUES (%(k)s, %(n)s, %(b)s, %(f)s), (%(k)s || 'x', NULL, NULL, NULL)",
            {"k": "a%", "n": 1 << 40, "b": b"\x00\xff", "f": True},
        )
        changed = s.execute("UPDATE t SET n = n + %s WHERE k LIKE 'a%%'", (1,))
        assert s._queued  # nothing sent yet
        assert changed.rowcount == 2
        rows = s.execute(
            "SELECT k, n, b, f, 7, 'txt', count(*) OVER () FROM t ORDER BY k"
        ).fetchall()
        assert rows == [("a%", (1 << 40) + 1, b"\x00\xff", True, 7, "txt", 2),
                        ("a%x", None, None, None, 7, "txt", 2)]  # fmt: skip
        failing = s.execute("SELECT 1 / %(zero)s", {"zero": 0})
        with pytest.raises(psycopg.errors.DivisionByZero):
            failing.fetchone()
        conn.execute("ROLLBACK")


def test_only_statements_of_few_parameters_are_kept_prepared() -> None:
    """A store's own connection prepares a statement once, but not one of more than
    ``PREPARED_PARAMS_MAX`` parameters: the native zones' batches are a statement per batch
    size, each kept by the server for the connection's life if prepared."""
    import psycopg

    from quickzones.backends.postgres import wire
    from quickzones.backends.postgres.native_session import WireSession

    server = postgres_store_url().split("?")[0]
    with psycopg.connect(server, autocommit=True, prepare_threshold=None) as conn:
        wire.enroll(conn, wire.Preparing(True, "test"))
        s = WireSession(conn)
        for n in (1, 2, wire.PREPARED_PARAMS_MAX, wire.PREPARED_PARAMS_MAX + 1, 200):
            args = {f"p{k}": k for k in range(n)}
            sql = "SELECT " + " + ".join(f"%(p{k})s" for k in range(n))
            for _ in range(2):
                assert s.execute(sql, args).fetchone() == (sum(range(n)),)
        kept = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        assert kept == (3,)
