"""A PostgreSQL commit whose answer was lost (``commit_unknown_result``) is reported only
once its server session's transaction has ended, so a read made next to learn whether it
committed sees the final outcome (issue 42 point 5: under lost answers, a worker's check
of a maybe-committed transactional attempt read before that attempt's COMMIT landed, ran
the handler again, and its effect committed twice)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from quickzones.backends.postgres.store import PostgresStore
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")


@pytest.fixture()
def store() -> Iterator[PostgresStore]:
    s = PostgresStore.from_url(postgres_store_url())
    yield s
    s.close()


def test_waits_until_the_session_has_ended_its_transaction(store: PostgresStore) -> None:
    server = postgres_store_url().split("?")[0]
    with psycopg.connect(server) as other:
        other.execute("SELECT 1")  # a transaction open, as a COMMIT still under way is
        pid = other.info.backend_pid
        ended: list[float] = []
        waiter = threading.Thread(
            target=lambda: ended.append(time.monotonic()) if store.wait_for_session(pid) else None
        )
        waiter.start()
        time.sleep(0.3)
        assert not ended, "returned while the session was still in its transaction"
        committed = time.monotonic()
        other.commit()
        waiter.join(5)
        assert ended and ended[0] >= committed


def test_an_idle_or_unknown_session_is_not_waited_for(store: PostgresStore) -> None:
    server = postgres_store_url().split("?")[0]
    with psycopg.connect(server, autocommit=True) as idle:
        started = time.monotonic()
        assert store.wait_for_session(idle.info.backend_pid)
        assert store.wait_for_session(2**31 - 1)  # no such session (a pooler's id)
        assert time.monotonic() - started < 1.0


def test_a_session_that_never_ends_is_waited_for_no_longer_than_asked(
    store: PostgresStore,
) -> None:
    server = postgres_store_url().split("?")[0]
    with psycopg.connect(server) as other:
        other.execute("SELECT 1")
        started = time.monotonic()
        assert not store.wait_for_session(other.info.backend_pid, within_s=0.3)
        assert time.monotonic() - started < 2.0
