"""Idle consumers on FoundationDB hear of another process's enqueue through a watch on the
store's wake key (``quickzones.backends.fdb.wake_watch``, issue 44 point 4), against a
real cluster: an enqueue that makes a zone active moves the count and ends a wait at
once; an enqueue into a zone already active does not touch the key; the simulator's
binding, which has no watches, offers no counter (its consumers poll)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from quickzones.backends.fdb import FDBStore
from quickzones.client import Quick
from quickzones.store.kv import commit_counter_of, commit_waiter_of
from tests.conftest import HAVE_FDB, fdb_store_url
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")


@pytest.fixture
def url() -> str:
    return fdb_store_url()


@pytest.fixture
def watching(url: str) -> Iterator[FDBStore]:
    """The consumer's side: a store of its own (another client's commits wake it)."""
    store = FDBStore.from_url(url)
    yield store
    store.close()


def _wake_value(store: FDBStore) -> int:
    tr = store.create_transaction()
    raw = tr.get(b"\x02quick-wake\x00")
    return 0 if raw is None else int.from_bytes(raw, "little", signed=True)


def test_an_enqueue_that_makes_a_zone_active_wakes_a_waiter_at_once(
    url: str, watching: FDBStore
) -> None:
    counter, waiter = commit_counter_of(watching), commit_waiter_of(watching)
    assert counter is not None and waiter is not None
    before = counter()  # starts the watch; a bump from now on is seen
    assert watching.commits_signalled
    producer = Quick.open(url)
    try:
        woke: list[float] = []

        def wait() -> None:
            began = time.monotonic()
            waiter(30.0)
            woke.append(time.monotonic() - began)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        producer.enqueue("t", {"n": 1}, app="a", tenant="x")
        thread.join(30)
        assert woke and woke[0] < 5.0, f"the wait ended after {woke} s, not on the enqueue"
        assert wait_for(lambda: counter() != before)
        # The zone is active now: more enqueues into it leave the wake key alone.
        bumped = _wake_value(watching)
        for n in range(5):
            producer.enqueue("t", {"n": n}, app="a", tenant="x")
        assert _wake_value(watching) == bumped
        # Another zone becoming active bumps it again.
        producer.enqueue("t", {"n": 1}, app="a", tenant="y")
        assert _wake_value(watching) == bumped + 1
    finally:
        producer.close()


def test_a_bump_between_a_read_and_the_next_wait_is_not_slept_through(
    url: str, watching: FDBStore
) -> None:
    counter, waiter = commit_counter_of(watching), commit_waiter_of(watching)
    assert counter is not None and waiter is not None
    counter()
    waiter(0.01)  # whatever happened before is waited out
    producer = Quick.open(url)
    try:
        seen = counter()
        producer.enqueue("t", {"n": 1}, app="a", tenant="z")
        assert wait_for(lambda: counter() != seen)
        began = time.monotonic()
        waiter(30.0)  # the bump came before this wait: it returns at once
        assert time.monotonic() - began < 5.0
    finally:
        producer.close()


def test_close_ends_the_watch_and_waits() -> None:
    store = FDBStore.from_url(fdb_store_url())
    counter, waiter = commit_counter_of(store), commit_waiter_of(store)
    assert counter is not None and waiter is not None
    counter()
    threads = [t for t in threading.enumerate() if t.name == "quick-fdb-wake"]
    assert threads
    store.close()
    began = time.monotonic()
    waiter(30.0)
    assert time.monotonic() - began < 5.0
    assert not store.commits_signalled


def test_the_simulator_offers_no_counter() -> None:
    store = FDBStore.from_url("fdbsim://")
    try:
        assert commit_counter_of(store) is None
        assert commit_waiter_of(store) is None
        assert not store.commits_signalled
    finally:
        store.close()
