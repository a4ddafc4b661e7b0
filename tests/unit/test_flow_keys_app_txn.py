"""Idempotency and debounce keys inside the application's own transaction
(``enqueue_on``, issue 45 point 1): the key and the item commit with the app's row or not
at all, and two app transactions enqueueing one key at once store one item."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones import Debounce
from quickzones.client import Quick
from quickzones.store.records import ZoneId
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

Z = ZoneId("shop", "t1")


@pytest.fixture()
def sqlite_q(tmp_path: Path) -> Iterator[tuple[Quick, Path]]:
    db = tmp_path / "app.db"
    quick = Quick.open(f"sqlite:///{db}")
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    yield quick, db
    quick.close()


def test_sqlite_rollback_leaves_the_key_free(sqlite_q: tuple[Quick, Path]) -> None:
    q, db = sqlite_q
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO orders VALUES (1)")
    q.enqueue_on(conn, "ship", b"1", app=Z.app, tenant=Z.tenant, idempotency_key="order-1")
    conn.rollback()
    conn.execute("INSERT INTO orders VALUES (1)")
    first = q.enqueue_on(conn, "ship", b"1", app=Z.app, tenant=Z.tenant, idempotency_key="order-1")
    assert first.duplicate is None  # type: ignore[attr-defined]
    conn.commit()
    again = q.enqueue_on(conn, "ship", b"1", app=Z.app, tenant=Z.tenant, idempotency_key="order-1")
    conn.commit()
    assert again == first and again.duplicate == "queued"  # type: ignore[attr-defined]
    assert q.zones.count(Z) == 1
    conn.close()


def test_sqlite_debounce_in_the_app_transaction(sqlite_q: tuple[Quick, Path]) -> None:
    q, db = sqlite_q
    conn = sqlite3.connect(db)
    d = Debounce("doc", wait_s=0, max_wait_s=0)
    ids = set()
    for n in range(3):
        ids.add(q.enqueue_on(conn, "ship", {"n": n}, app=Z.app, tenant=Z.tenant, debounce=d))
        conn.commit()
    ran: list[Any] = []
    q.job("ship")(lambda payload, ctx: ran.append(payload))
    q.run_until_idle()
    assert len(ids) == 1 and ran == [{"n": 2}]
    conn.close()


@pytest.mark.skipif(postgres_skip_reason() is not None, reason=str(postgres_skip_reason()))
@pytest.mark.parametrize("isolation", ["read committed", "serializable"])
def test_postgres_two_app_transactions_on_one_key_store_one_item(isolation: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    url = postgres_store_url()
    q = Quick.open(url)
    server = url.split("?")[0]
    ids: list[str] = []
    errors: list[BaseException] = []
    both_enqueued = threading.Barrier(2, timeout=2)

    def app(n: int) -> None:
        try:
            with psycopg.connect(server) as conn:
                conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                ids.append(
                    q.enqueue_on(
                        conn, "ship", str(n), app=Z.app, tenant=Z.tenant, idempotency_key="k"
                    )
                )
                try:
                    both_enqueued.wait()  # the first holds its transaction open meanwhile
                except threading.BrokenBarrierError:
                    pass  # the other waits on our commit: nothing to line up
                conn.commit()
        except BaseException as err:  # a serialization failure is the app's to retry
            errors.append(err)

    threads = [threading.Thread(target=app, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert q.zones.count(Z) == 1
        committed = [i for i in ids if q.get(Z.app, Z.tenant, i) is not None]
        assert len(set(committed)) == 1
        assert len(ids) + len(errors) == 2
    finally:
        q.close()


def test_sqlite_one_at_a_time_in_the_app_transaction(sqlite_q: tuple[Quick, Path]) -> None:
    q, db = sqlite_q
    conn = sqlite3.connect(db)
    q.enqueue_on(conn, "ship", {"n": -1}, app=Z.app, tenant=Z.tenant, one_at_a_time="acct")
    conn.rollback()  # neither the item nor its place in the key's line
    for n in range(3):
        conn.execute("INSERT INTO orders VALUES (?)", (n,))
        q.enqueue_on(conn, "ship", {"n": n}, app=Z.app, tenant=Z.tenant, one_at_a_time="acct")
        conn.commit()
    conn.close()
    leased, _ = q.items.dequeue(Z, 10, 30_000)
    assert [i.payload for i in leased] == [b'{"n":0}']
    ran: list[Any] = []
    q.job("ship")(lambda payload, ctx: ran.append(payload["n"]))
    q.items.complete(Z, leased[0].item_id, leased[0].lease_id)
    q.run_until_idle()
    assert ran == [1, 2]
