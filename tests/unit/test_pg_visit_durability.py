"""On PostgreSQL a consumer's visit commits without waiting for the server's WAL flush
(``kv.relax_durability``): a small tenant's item started only after its visit's leases
were flushed to disk, a flush of its own per visit (under a noisy neighbour, a small
tenant's pickup p99 52 ms against 31 ms without the waits, `docs/performance.md`).
Enqueues and completions still wait for theirs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quickzones.client import Quick
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")

TRIES = 1000  # most runs need one; other sessions' commits flush the WAL too


@pytest.fixture()
def url() -> str:
    return postgres_store_url()


@pytest.fixture()
def watcher(url: str) -> Iterator[object]:
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        yield conn


def _lsn(conn: object, what: str) -> int:
    row = conn.execute(f"SELECT pg_current_wal_{what}_lsn() - '0/0'::pg_lsn").fetchone()  # type: ignore[attr-defined]
    return int(row[0])


def test_a_handler_starts_before_its_visit_is_flushed(url: str, watcher: object) -> None:
    """Nothing but the visit writes between the enqueue's durable commit and the handler's
    start, so a visit that waited for its flush leaves the flushed WAL past where it was
    before the visit, every time; one that did not leaves it there, unless another
    session's commit or the WAL writer flushed meanwhile: seen in some of the tries."""
    q = Quick.open(url)
    seen: list[bool] = []
    before: list[int] = [0]

    @q.job("look")
    def look(payload: object, ctx: object) -> None:
        seen.append(_lsn(watcher, "flush") <= before[-1])

    try:
        q.enqueue("look", {}, app="a", tenant="warm-up")
        assert q.run_until_idle() == 1  # the scanner's lease and the caches, taken
        seen.clear()
        for i in range(TRIES):
            q.enqueue("look", {"i": i}, app="a", tenant=f"t{i % 7}")
            before.append(_lsn(watcher, "insert"))
            assert q.run_until_idle() == 1
            if seen[-1]:
                break
        assert any(seen), f"every one of {len(seen)} handlers started after its visit's flush"
    finally:
        q.close()


def test_an_enqueue_and_a_completion_are_flushed_before_they_return(
    url: str, watcher: object
) -> None:
    q = Quick.open(url)

    @q.job("noop")
    def noop(payload: object, ctx: object) -> None:
        return None

    try:
        for i in range(5):
            start = _lsn(watcher, "insert")
            q.enqueue("noop", {"i": i}, app="a", tenant="t")
            assert _lsn(watcher, "flush") > start  # the enqueue's commit, flushed
            done = _lsn(watcher, "insert")
            assert q.run_until_idle() == 1
            assert _lsn(watcher, "flush") > done  # the completion's, after the visit's
    finally:
        q.close()

