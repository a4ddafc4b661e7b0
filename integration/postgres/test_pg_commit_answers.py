"""A COMMIT whose answer is lost after the server committed it (a proxy, a NAT, a
failover cutting the connection at that moment): the store learns from the commit's own
log row that it committed, instead of reporting ``commit_unknown_result`` and letting the
caller run it again. Seen (issue 42 point 5): an enqueue retried after such a COMMIT
stored its item a second time when a consumer had already run and completed the first,
and its effect committed twice (2 of 8 runs of the exactly-once test under lost answers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from integration.postgres.reply_cutter import COMMITTED, ReplyCutter
from quickzones.backends.postgres.store import PostgresStore
from quickzones.client import Quick
from quickzones.store.kv import run
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
pytest.importorskip("psycopg")

T = TypeVar("T", bound=Any)


@contextmanager
def _both(open_: Callable[[str], T], cut_url: str, url: str) -> Iterator[tuple[T, T]]:
    """One client through the cutter, one straight to the server; both closed after."""
    cut, straight = open_(cut_url), open_(url)
    try:
        yield cut, straight
    finally:
        cut.close()
        straight.close()


@pytest.fixture()
def through() -> Iterator[tuple[str, str, ReplyCutter]]:
    """(the store URL through a reply cutter, the same store straight, the cutter)."""
    url = postgres_store_url()
    port = urlsplit(url).port
    assert port is not None
    cutter = ReplyCutter(port)
    try:
        yield url.replace(f":{port}/", f":{cutter.port}/"), url, cutter
    finally:
        cutter.close()


def test_a_commit_whose_answer_was_lost_is_known_to_have_committed(
    through: tuple[str, str, ReplyCutter],
) -> None:
    cut_url, url, cutter = through
    with _both(PostgresStore.from_url, cut_url, url) as (store, straight):
        tr = store.create_transaction()
        tr.set(b"order/1", b"paid")
        with cutter.cutting(1.0, holding=COMMITTED):
            tr.commit()  # raised commit_unknown_result before
        assert cutter.cut >= 1  # the COMMIT's answer was indeed lost
        assert run(straight, lambda t: t.get(b"order/1")) == b"paid"


def test_an_enqueue_whose_commit_answer_was_lost_stores_its_item_once(
    through: tuple[str, str, ReplyCutter],
) -> None:
    cut_url, url, cutter = through
    runs: list[str] = []
    with _both(Quick.open, cut_url, url) as (producer, consumer):

        @consumer.job("ship")
        def ship(payload: object, ctx: object) -> None:
            runs.append(str(payload))

        # The producer's first enqueue makes what it makes once (its job type's policy,
        # the steady clock's floor): every answer holding a COMMIT is cut below.
        producer.enqueue("ship", {"order": 6}, app="shop", tenant="t")
        with cutter.cutting(1.0, holding=COMMITTED):
            producer.enqueue("ship", {"order": 7}, app="shop", tenant="t")
        assert cutter.cut >= 1
        assert consumer.run_until_idle() == 2
        assert sorted(runs) == ["{'order': 6}", "{'order': 7}"]


def _newest_log_row(url: str, store: PostgresStore) -> tuple[int, list[bytes], list[bytes], int]:
    """The newest ``quick_log`` row of ``store``: (clock, begins, ends, id)."""
    import psycopg

    with psycopg.connect(url.split("?")[0]) as conn:
        row = conn.execute(
            f'SELECT at, begins, ends, id FROM "{store.schema}".quick_log ORDER BY id DESC LIMIT 1'
        ).fetchone()
    assert row is not None
    at, begins, ends, row_id = row
    return int(at), [bytes(b) for b in begins], [bytes(e) for e in ends], int(row_id)


def test_the_lookup_finds_an_enqueue_that_pulled_its_pointer_by_the_ranges_it_sent(
    through: tuple[str, str, ReplyCutter],
) -> None:
    """An enqueue into a drained zone whose commit also pulled the zone's pointer
    (``quick_pull3``): the server adds the pointer's three keys to the commit's log row,
    after the ranges the client sent, so a lost answer is looked up by those alone."""

    _, url, _ = through
    q = Quick.open(url)
    try:
        q.job("ship")(lambda payload, ctx: None)
        q.enqueue("ship", {"order": 1}, app="shop", tenant="t")
        assert q.run_until_idle() == 1  # the zone emptied: its pointer vests later
        q.enqueue("ship", {"order": 2}, app="shop", tenant="t")
        store = q.kv
        assert isinstance(store, PostgresStore)
        at, begins, ends, row_id = _newest_log_row(url, store)
        top = q.toplevel
        pointer = top.get_pointer(q.zone("shop", "t"))
        assert pointer is not None
        record = top.keys.pointer_key(top.cluster, top.shard_for(pointer.zone), pointer.pointer_id)
        assert begins[-3] == record  # pulled in this commit: its keys come last
        assert store.logged_commit(at, begins[:-3], ends[:-3]) == row_id
        assert store.logged_commit(at, [b"order/3"], [b"order/3\x00"]) is None
    finally:
        q.close()


def test_the_commit_log_lookup_finds_a_commit_by_its_clock_and_ranges_and_nothing_else(
    through: tuple[str, str, ReplyCutter],
) -> None:
    """What the store looks up after a lost answer: the row a commit wrote, by the
    client's clock and its write ranges; a commit that never happened finds none, so the
    caller retries it."""
    _, url, _ = through
    store = PostgresStore.from_url(url)
    try:
        tr = store.create_transaction()
        tr.set(b"order/2", b"paid")
        tr.commit()
        at, begins, ends, row_id = _newest_log_row(url, store)
        assert b"order/2" in begins  # the row of this commit, the newest
        assert store.logged_commit(at, begins, ends) == row_id
        assert store.logged_commit(at + 1, begins, ends) is None  # another moment
        assert store.logged_commit(at, [b"order/3"], [b"order/3\x00"]) is None  # other keys
    finally:
        store.close()
