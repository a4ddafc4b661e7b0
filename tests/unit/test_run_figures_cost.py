"""Issue 45 point 4 at no cost per item: what the dashboard shows of running items, run
times and failed runs is counted in the consumer's memory and reaches the store with its
heartbeat, never in the transactions that start or end a run. Before, every run set and
cleared a running-index key and added to its job type's run-time counter as it ended
(+10-25 % CPU per item, and on PostgreSQL a key every completion of a type locked).

Every commit is watched through the memory store's constructor hook (``commit_hook``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.registry import RetryPolicy
from quickzones.store import heartbeats, run_figures
from quickzones.store.keys import KeySpace
from quickzones.store.kv import run
from quickzones.store.records import ZoneId

Commit = Callable[[Any], tuple[int, int]]
_FIGURES = ("runtime", "errors", "running")


class Writes:
    """The keys each commit wrote (its write conflict ranges' starts)."""

    def __init__(self) -> None:
        self.commits: list[list[bytes]] = []

    def __call__(self, request: Any, commit: Commit) -> tuple[int, int]:
        self.commits.append([begin for begin, _ in request.write_conflicts])
        return commit(request)

    def touching(self, keys: KeySpace) -> list[list[bytes]]:
        """The commits that wrote a run figure or a running entry."""
        spans = [keys.meta_range(name) for name in _FIGURES]
        return [
            written
            for written in self.commits
            if any(begin <= key < end for key in written for begin, end in spans)
        ]


def test_runs_write_their_figures_only_with_the_heartbeat() -> None:
    clock = ManualClock(1_700_000_000.0)
    writes = Writes()
    q = Quick(MemoryStore(clock=clock, commit_hook=writes), clock=clock)
    q.job("ok")(lambda payload, ctx: None)

    @q.job("bad", retry=RetryPolicy(max_attempts=1))
    def bad(payload: Any, ctx: Any) -> None:
        raise ValueError("no")

    for n in range(10):
        q.enqueue("ok", n, app="a", tenant=f"t{n}")
        q.enqueue("bad", n, app="a", tenant=f"t{n}")
    consumer = q.consumer(ConsumerConfig(in_order=True), name="c")
    assert consumer.run_until_idle() == 20
    assert writes.touching(q.keys) == [], "a run wrote a figure of its own"
    assert run_figures.error_history(q.kv, q.keys, "a", now_ms(clock))[-1].total == 0

    consumer.heartbeats.beat_once()
    assert len(writes.touching(q.keys)) == 1, "one flush adds them all"
    now = now_ms(clock)
    ran = run_figures.runtimes(q.kv, q.keys, "a", ["ok", "bad"], now)
    assert sum(ran["ok"].values()) == 10 and sum(ran["bad"].values()) == 10
    assert run_figures.error_history(q.kv, q.keys, "a", now)[-1].by_type == {"bad": 10}
    q.close()


def test_a_retry_writes_no_dead_letter_group_count() -> None:
    """The dead-letter groups are counted where a letter is written (rare, and a write
    already); a run that fails and is retried touches no group's key, so the retries of
    one job type never meet on one key."""
    clock = ManualClock(1_700_000_000.0)
    writes = Writes()
    q = Quick(MemoryStore(clock=clock, commit_hook=writes), clock=clock)
    failed: set[int] = set()

    @q.job("flaky", retry=RetryPolicy(max_attempts=3, backoff_base_s=1, backoff_cap_s=1))
    def flaky(payload: int, ctx: Any) -> None:
        if payload not in failed:
            failed.add(payload)
            raise TimeoutError("try again")

    for n in range(5):
        q.enqueue("flaky", n, app="a", tenant="t")
    consumer = q.consumer(ConsumerConfig(in_order=True), name="c")
    consumer.run_until_idle()
    clock.advance(5.0)
    consumer.run_until_idle()
    assert failed == set(range(5)) and q.dead_letters(app="a") == []
    begin, end = q.keys.meta_range("dead-groups")

    def counted() -> int:
        return len([w for w in writes.commits if any(begin <= key < end for key in w)])

    assert counted() == 0
    zone = q.zone("a", "t")
    q.zones.dead_letter(zone, q.enqueue("flaky", 9, app="a", tenant="t"), None, "x")
    assert counted() == 1, "a dead letter counts in its group"
    q.close()


def test_a_consumer_lists_what_it_runs_in_its_heartbeat() -> None:
    """The running page's source: each item its handlers run now, with its lease's end."""
    clock = ManualClock(1_700_000_000.0)
    q = Quick(MemoryStore(clock=clock), clock=clock)
    consumer = q.consumer(name="c")
    seen: list[heartbeats.Heartbeat] = []

    @q.job("slow")
    def slow(payload: Any, ctx: Any) -> None:
        clock.advance(2.0)
        consumer.heartbeats.beat_once()  # a beat while it runs
        seen.extend(heartbeats.heartbeats(q.kv, q.keys, running=True))
        # The list is a key of its own: the beats' expiry scan and the workers page
        # read the small records only.
        [record] = heartbeats.heartbeats(q.kv, q.keys)
        assert record.running == ()

    item_id = q.enqueue("slow", {}, app="a", tenant="t")
    consumer.run_until_idle()
    [beat] = seen
    [running] = beat.running
    assert (running.zone.app, running.zone.tenant, running.item_id) == ("a", "t", item_id)
    assert running.job_type == "slow" and running.attempts == 1 and beat.running_more == 0
    assert running.since_ms == 1_700_000_000_000 and running.lease_until_ms > running.since_ms
    consumer.heartbeats.beat_once()
    assert heartbeats.heartbeats(q.kv, q.keys, running=True)[0].running == ()
    begin, end = q.keys.meta_range("consumer-running")
    assert run(q.kv, lambda tr: tr.get_range(begin, end)) == [], "nothing runs: no list"
    q.close()


def test_a_record_lists_at_most_the_hundred_longest_running() -> None:
    runs = [
        heartbeats.RunningItem(ZoneId("a", f"t{n:03}"), f"i{n}", "j", 1, 1_000 + n, 9_999)
        for n in range(250)
    ]
    listed, more = heartbeats.listed(reversed(runs))
    assert [r.item_id for r in listed] == [f"i{n}" for n in range(heartbeats.RUNNING_MAX)]
    assert more == 150
    zone = ZoneId("a" * 200, "t" * 200)
    long = [heartbeats.RunningItem(zone, f"{n:0200}", "j" * 200, 1, n, 9_999) for n in range(100)]
    listed, more = heartbeats.listed(long)
    assert 0 < len(listed) < 100 and more == 100 - len(listed), "a value stays in bounds"
