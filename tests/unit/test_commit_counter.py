"""The commit counter of the stores other processes share (``data_version``, the
CommitCounter capability: SQLite and PostgreSQL) changes on commits this store object did
not make: another process's, another store object's, an application's own connection's.
Its own commits (a consumer's visits and completions, its process's enqueues, which wake
their consumers directly) leave it alone, so a waiter is not woken by the commits of the
very process it runs in."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.store.kv import KVStore, run
from quickzones.urls import open_kv
from tests.conftest import HAVE_POSTGRES, store_url
from tests.other_process import enqueue_from_another_process

SHARED_STORES = ["sqlite", *(["postgres"] if HAVE_POSTGRES else [])]


@pytest.fixture(params=SHARED_STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(str(request.param), tmp_path)


def _counter(store: object) -> Callable[[], int]:
    counter = getattr(store, "data_version", None)
    assert callable(counter), f"{type(store).__name__} has no commit counter"
    return counter  # type: ignore[no-any-return]


def test_the_stores_own_commits_leave_the_counter_alone(url: str) -> None:
    store = open_kv(url)
    try:
        before = _counter(store)()

        def commits(offset: int) -> None:
            for n in range(50):
                run(store, lambda tr, n=n: tr.set(b"k%d-%d" % (offset, n), b"v"))

        threads = [threading.Thread(target=commits, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert _counter(store)() == before
    finally:
        store.close()


def test_another_store_objects_commit_changes_it(url: str) -> None:
    store, other = open_kv(url), open_kv(url)
    try:
        before = _counter(store)()
        run(other, lambda tr: tr.set(b"k", b"v"))
        after = _counter(store)()
        assert after != before
        run(store, lambda tr: tr.set(b"mine", b"v"))
        assert _counter(store)() == after  # and our own next one does not
    finally:
        other.close()
        store.close()


def test_another_processes_enqueue_changes_it(url: str) -> None:
    q = Quick.open(url)
    try:
        before = _counter(q.kv)()
        enqueue_from_another_process(url, "t")
        assert _counter(q.kv)() != before
    finally:
        q.close()


@contextmanager
def _app_transaction(url: str, q: Quick) -> Iterator[tuple[Any, Callable[[], None]]]:
    """The application's own connection to the store's database, in a transaction:
    (connection, commit)."""
    if url.startswith("sqlite"):
        app = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        app.execute("BEGIN")
        try:
            yield app, lambda: app.execute("COMMIT") and None
        finally:
            app.close()
        return
    import psycopg

    with psycopg.connect(url.split("?")[0]) as conn:
        yield conn, conn.commit


def test_an_enqueue_on_the_applications_own_connection_changes_it(url: str) -> None:
    """The application's connection is not the store's, even in one process: its enqueue
    must wake the consumer like another process's, once the application commits."""
    q = Quick.open(url)
    try:
        app_tx: AbstractContextManager[tuple[Any, Callable[[], None]]] = _app_transaction(url, q)
        with app_tx as (conn, commit):
            before = _counter(q.kv)()
            q.enqueue_on(conn, "job", {"n": 1}, app="a", tenant="t")
            commit()
        assert _counter(q.kv)() != before
    finally:
        q.close()


def test_a_closed_store_says_so(url: str) -> None:
    store: KVStore = open_kv(url)
    _counter(store)()
    store.close()
    with pytest.raises(Exception, match="closed"):
        _counter(store)()
