"""Counters read as the sum of their shards (``sharded_counts``): what commits into an
application's open transaction add lands on a shard of its own, every reader sums them,
and a zone that empties is collected with all of them, on every backend."""

from __future__ import annotations

from typing import Any

from quickzones.client import Quick
from quickzones.store import sharded_counts
from quickzones.store.kv import KVTransaction, run
from quickzones.store.records import ZoneId

Z = ZoneId("app", "t1")


class JoinsApplication:
    """A transaction standing for one that commits into an application's own (on
    PostgreSQL, ``enqueue_on``'s): the attribute the shard choice reads."""

    joins_application = True

    def __init__(self, tr: KVTransaction) -> None:
        self._tr = tr

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)


def test_adds_inside_application_transactions_take_shards_and_readers_sum_them(
    q: Quick,
) -> None:
    key = q.keys.count_key(Z)
    run(q.kv, lambda tr: sharded_counts.add(tr, key, 5))
    for _ in range(20):
        run(q.kv, lambda tr: sharded_counts.add(JoinsApplication(tr), key, 2))  # type: ignore[arg-type]
    run(q.kv, lambda tr: sharded_counts.add(tr, key, -3))
    rows = run(q.kv, lambda tr: tr.get_range(*sharded_counts.key_range(key)))
    assert rows[0][0] == key  # shard 0: the key itself, which older releases read
    assert 1 < len(rows) <= sharded_counts.SHARDS
    assert run(q.kv, lambda tr: sharded_counts.read(tr, key)) == 5 + 40 - 3


def test_a_zone_counted_on_shards_is_empty_once_its_items_are_gone_and_leaves_no_key(
    q: Quick,
) -> None:
    key = q.keys.count_key(Z)
    item = q.enqueue("job", b"x", app=Z.app, tenant=Z.tenant)
    for _ in range(3):  # as three open requests' enqueues would have counted
        run(q.kv, lambda tr: sharded_counts.add(JoinsApplication(tr), key, 1))
        run(q.kv, lambda tr: sharded_counts.add(tr, key, -1))
    assert q.zones.count(Z) == 1
    assert not q.transact(lambda tr: q.zones.zone_is_empty(tr, Z))
    q.cancel(Z.app, Z.tenant, item)
    assert q.zones.count(Z) == 0
    assert q.transact(lambda tr: q.zones.zone_is_empty(tr, Z))
    assert run(q.kv, lambda tr: tr.get_range(*q.keys.zone_range(Z))) == []
