"""A completion whose commit fails with a retryable error is tried again (issue 44): the
batched completer once took the batch off its list before the commit and dropped it when
the commit failed, so those items, run and finished, kept their leases until they lapsed
(30 s by default) and then ran again, each charged one more attempt. Now the batch goes
back on the list and the flusher commits it at its next try; nothing waits for a lease to
lapse and nothing runs twice. An error that retrying cannot help is still reported once
and left to the lease, as before."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.completer import BatchedCompleter
from quickzones.consumer.runtime import Consumer
from quickzones.consumer.state import Cluster, Work
from quickzones.errors import StorageError
from quickzones.store.records import ZoneId
from tests.waiting import wait_for

A, B = ZoneId("app", "a"), ZoneId("app", "b")


class FailingCommits:
    """A zone store whose next ``fail`` merged completions raise ``error``; everything
    else is the real store's."""

    def __init__(self, inner: Any, fail: int, error: StorageError) -> None:
        self.inner = inner
        self.fail = fail
        self.error = error
        self.calls = 0

    def complete_zones(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.fail > 0:
            self.fail -= 1
            raise self.error
        return self.inner.complete_zones(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _leased(q: Quick, zone: ZoneId, n: int) -> list[Work]:
    q.enqueue_many("job", [b""] * n, app=zone.app, tenant=zone.tenant)
    items, _ = q.zones.dequeue(zone, n, 60_000)
    assert len(items) == n
    now = q.clock.now()
    return [Work(zone, item, now) for item in items]


def test_a_batch_whose_commit_failed_retryably_commits_at_the_next_flush(q: Quick) -> None:
    store = FailingCommits(q.zones, 1, StorageError("database is locked", retryable=True))
    events: list[tuple[str, dict[str, Any]]] = []
    completer = BatchedCompleter(
        {"default": Cluster(store, q.toplevel, q.kv)},  # type: ignore[arg-type]
        lambda event, **fields: events.append((event, fields)),
    )
    for work in _leased(q, A, 2) + _leased(q, B, 1):
        completer.complete(work)
    completer.flush()
    assert [e for e, _ in events if e != "completions_flushed"] == ["complete_error"] * 2
    assert q.zones.count(A) == 2 and q.zones.count(B) == 1  # nothing committed yet
    events.clear()
    assert completer.flush() == 3  # the same three, at the next flush
    assert sorted(e for e, _ in events if e != "completions_flushed") == ["completed"] * 3
    assert q.zones.count(A) == 0 and q.zones.count(B) == 0
    assert completer.flush() == 0  # nothing left over


def test_a_flush_that_raises_keeps_its_batch_for_the_next(q: Quick) -> None:
    class Broken(FailingCommits):
        def complete_zones(self, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.fail > 0:
                self.fail -= 1
                raise OSError("disk I/O error")  # not a StorageError: the flush raises
            return self.inner.complete_zones(*args, **kwargs)

    store = Broken(q.zones, 1, StorageError("unused"))
    completer = BatchedCompleter(
        {"default": Cluster(store, q.toplevel, q.kv)},  # type: ignore[arg-type]
        lambda event, **fields: None,
    )
    for work in _leased(q, A, 2):
        completer.complete(work)
    with pytest.raises(OSError):
        completer.flush()
    assert completer.flush() == 2
    assert q.zones.count(A) == 0


def test_a_commit_that_retrying_cannot_help_is_reported_once_and_not_retried(q: Quick) -> None:
    store = FailingCommits(q.zones, 100, StorageError("value too large", retryable=False))
    events: list[str] = []
    completer = BatchedCompleter(
        {"default": Cluster(store, q.toplevel, q.kv)},  # type: ignore[arg-type]
        lambda event, **fields: events.append(event),
    )
    for work in _leased(q, A, 2):
        completer.complete(work)
    completer.flush()
    assert completer.flush() == 0
    assert events.count("complete_error") == 1 and store.calls == 1


def test_a_running_consumer_completes_an_item_whose_completion_commit_failed_once(
    real_q: Quick,
) -> None:
    """End to end: the item is completed by the flusher's next try, long before its
    (one hour) lease could lapse, and its handler runs once: no attempt is charged."""
    runs: list[str] = []
    real_q.job("job")(lambda payload, ctx: runs.append(ctx.item_id))
    item_id = real_q.enqueue("job", {"n": 1}, app="app", tenant="a")
    store = FailingCommits(real_q.zones, 1, StorageError("database is locked", retryable=True))
    consumer = Consumer(
        store,  # type: ignore[arg-type]
        real_q.toplevel,
        real_q.registry,
        kv=real_q.kv,
        config=ConsumerConfig(workers=2, item_lease_s=3600, idle_sleep_s=0.01),
    )
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["completed"] == 1, timeout=30)
    finally:
        consumer.stop(5)
    assert store.calls >= 2 and consumer.stats["complete_error"] == 1
    assert runs == [item_id]
    assert real_q.zones.count(A) == 0
