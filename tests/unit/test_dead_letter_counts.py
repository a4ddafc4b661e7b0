"""Issue 43: an app's dead letters are counted by counters kept with them (its total and
its (job type, error) groups), backfilled a bounded step at a time on a store written
before the counters existed, and every letter written, requeued or purged while the
backfill runs is counted exactly once. On every store."""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.store import admin, dead_groups
from quickzones.store.kv import KVTransaction, pack_i64
from quickzones.store.records import WorkItem, ZoneId, encode_item
from tests.counting_kv import CountingKV, bury


def _forget_counters(q: Quick, app: str) -> None:
    """Make the store look written before the counters existed (with a stale group
    count, as the versions that kept groups but no total may have left)."""

    def clear(tr: KVTransaction) -> None:
        tr.clear(q.keys.meta_key("dead-total", app))
        tr.clear(q.keys.meta_key("dead-counted", app))
        tr.clear_range(*q.keys.meta_range("dead-groups", app))
        tr.add(q.keys.meta_key("dead-groups", app, "j", "buried"), pack_i64(7))

    q.transact(clear)


def _bury_large(q: Quick, app: str, tenant: str, item_id: str, size: int) -> None:
    """A dead letter whose item is split across chunk keys after the letter's record."""
    zone = ZoneId(app, tenant)
    item = WorkItem(item_id, "big", b"x" * size, 0, 0, 0)

    def write(tr: KVTransaction) -> None:
        q.zones._dead_letter_raw(
            tr, zone, item_id, encode_item(item), "too big", 1, job_type="big"
        )

    q.transact(write)


def _listed(q: Quick, app: str) -> int:
    return len(q.dead_letters(app=app))


def test_a_store_written_without_counters_counts_its_letters(q: Quick) -> None:
    bury(q, "a", "t1", [f"i{n:05d}" for n in range(1500)])
    _bury_large(q, "a", "t1", "i00999x", 250_000)  # its chunks straddle a step's end
    bury(q, "a", "t2", [f"k{n:04d}" for n in range(700)], job_type="k")
    bury(q, "other", "t", ["o1", "o2"])
    _forget_counters(q, "a")
    first = dead_groups.total(q.kv, q.keys, "a", steps=1)
    assert not first.exact and 0 < first.count < 2201
    assert admin.count_dead_letters(q, "a") == 2201 == _listed(q, "a")
    assert dead_groups.total(q.kv, q.keys, "a", steps=0) == dead_groups.Total(2201, True)
    assert dead_groups.group_count(q.kv, q.keys, "a", ("j", "buried")) == 1500  # not 1507
    assert dead_groups.group_count(q.kv, q.keys, "a", ("k", "buried")) == 700
    assert dead_groups.group_count(q.kv, q.keys, "a", ("big", "too big")) == 1
    assert admin.count_dead_letters(q) == 2203
    # Kept from then on by the writes themselves.
    q.requeue_dead_letter("a", "t1", "i00000")
    assert q.purge_dead_letters(app="a", tenant="t2") == 700
    bury(q, "a", "t3", ["n1"])
    assert admin.count_dead_letters(q, "a") == 1501 == _listed(q, "a")
    assert dead_groups.group_count(q.kv, q.keys, "a", ("k", "buried")) == 0


def test_letters_written_and_removed_during_the_backfill_are_counted_once(q: Quick) -> None:
    ids = [f"i{n:05d}" for n in range(3000)]
    bury(q, "a", "t", ids)
    _forget_counters(q, "a")
    assert not dead_groups.advance(q.kv, q.keys, "a")  # counted up to about i01000
    bury(q, "a", "t", ["i00000x", "i02500x"])  # one behind the boundary, one ahead
    bury(q, "a", "s", ["before"])  # tenant "s" sorts before "t": counted
    q.requeue_dead_letter("a", "t", "i00001")  # behind
    q.requeue_dead_letter("a", "t", "i02999")  # ahead
    bury(q, "a", "t", ["i00002"])  # a letter of the same id again, behind: one letter
    want = 3000 + 3 - 2
    assert admin.count_dead_letters(q, "a") == want == _listed(q, "a")
    assert dead_groups.group_count(q.kv, q.keys, "a", ("j", "buried")) == want


def test_a_counted_app_reads_its_count_not_its_letters(q: Quick) -> None:
    kv = CountingKV(q.kv)
    bury(q, "a", "t", [f"i{n:05d}" for n in range(2500)])
    assert admin.count_dead_letters(q, "a") == 2500
    kv.keys_read = 0
    assert dead_groups.total(kv, q.keys, "a", steps=2) == dead_groups.Total(2500, True)  # type: ignore[arg-type]
    assert kv.keys_read <= 3, kv.keys_read


def test_an_app_without_dead_letters_counts_zero_exactly(q: Quick) -> None:
    bury(q, "other", "t", ["o1"])
    assert dead_groups.total(q.kv, q.keys, "none", steps=0) == dead_groups.Total(0, True)
    assert admin.count_dead_letters(q, "none") == 0
