"""The SQLite store's commit counter (``data_version``, the CommitCounter capability)
changes on commits this store did not make: another process's, another store object's,
an application's own connection's. Its own commits (a consumer's visits and completions,
its process's enqueues, which wake their consumers directly) leave it alone, so a waiter
is not woken by the commits of the very process it runs in."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from quickzones.backends.sqlite import SQLiteStore
from quickzones.client import Quick
from quickzones.store.kv import run
from tests.other_process import enqueue_from_another_process


def test_the_stores_own_commits_leave_the_counter_alone(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "own.db"))
    try:
        before = store.data_version()

        def commits(offset: int) -> None:
            for n in range(50):
                run(store, lambda tr, n=n: tr.set(b"k%d-%d" % (offset, n), b"v"))

        threads = [threading.Thread(target=commits, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert store.data_version() == before
    finally:
        store.close()


def test_another_store_objects_commit_changes_it(tmp_path: Path) -> None:
    path = str(tmp_path / "two.db")
    store, other = SQLiteStore(path), SQLiteStore(path)
    try:
        before = store.data_version()
        run(other, lambda tr: tr.set(b"k", b"v"))
        after = store.data_version()
        assert after != before
        run(store, lambda tr: tr.set(b"mine", b"v"))
        assert store.data_version() == after  # and our own next one does not
    finally:
        other.close()
        store.close()


def test_another_processes_enqueue_changes_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'proc.db'}"
    q = Quick.open(url)
    try:
        before = q.kv.data_version()  # type: ignore[attr-defined]
        enqueue_from_another_process(url, "t")
        assert q.kv.data_version() != before  # type: ignore[attr-defined]
    finally:
        q.close()


def test_an_enqueue_on_the_applications_own_connection_changes_it(tmp_path: Path) -> None:
    """The application's sqlite3 connection is not the store's, even in one process:
    its enqueue must wake the consumer like another process's."""
    path = tmp_path / "app.db"
    q = Quick.open(f"sqlite:///{path}")
    app = sqlite3.connect(str(path), isolation_level=None)
    try:
        before = q.kv.data_version()  # type: ignore[attr-defined]
        app.execute("BEGIN")
        q.enqueue_on(app, "job", {"n": 1}, app="a", tenant="t")
        app.execute("COMMIT")
        assert q.kv.data_version() != before  # type: ignore[attr-defined]
    finally:
        app.close()
        q.close()
