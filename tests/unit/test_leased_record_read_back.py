"""A lease's record read back by its own store (issue 29 point 3): the store keeps the
record it wrote at a lease, by its bytes, and a read that finds exactly those bytes (the
completion's lease check) takes that item instead of decoding the record again. What a
read returns must not change: the item as decoded, and a record rewritten since (another
lease, an extension) is judged as stored.
"""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.errors import LeaseLost
from quickzones.store.kv import run
from quickzones.store.records import WorkItem, ZoneId, decode_item

Z = ZoneId("app", "t")


def stored(q: Quick, item_id: str) -> WorkItem:
    key = q.zones.keys.item_key(Z, item_id)
    raw = run(q.kv, lambda tr: tr.get(key))
    assert raw is not None
    return decode_item(key, raw)


def test_a_leased_item_read_back_is_the_item_as_decoded(q: Quick) -> None:
    q.enqueue("job", b"x", app=Z.app, tenant=Z.tenant)
    (leased,), _ = q.zones.dequeue(Z, 1, 1)
    q.clock.advance(0.01)  # type: ignore[attr-defined]
    # Leased again after its lease lapsed: the lapse counted, the old lease id kept.
    (again,), _ = q.zones.dequeue(Z, 1, 60_000)
    assert again.lapses == 1 and again.lease_id != leased.lease_id
    fresh = stored(q, again.item_id)
    assert again == fresh
    assert q.zones.get(Z, again.item_id) == fresh


def test_a_completion_after_another_lease_is_lost_and_the_holder_completes(q: Quick) -> None:
    item_id = q.enqueue("job", b"", app=Z.app, tenant=Z.tenant)
    (first,), _ = q.zones.dequeue(Z, 1, 1)
    q.clock.advance(0.01)  # type: ignore[attr-defined]
    (second,), _ = q.zones.dequeue(Z, 1, 60_000)
    (late,) = q.zones.complete_many(Z, [(item_id, str(first.lease_id))])
    assert isinstance(late, LeaseLost)
    assert "expired" in str(late)
    assert q.zones.get(Z, item_id) is not None
    assert q.zones.complete_many(Z, [(item_id, str(second.lease_id))]) == [None]
    assert q.zones.get(Z, item_id) is None and q.zones.count(Z) == 0


def test_a_completion_after_an_extension_completes(q: Quick) -> None:
    item_id = q.enqueue("job", b"", app=Z.app, tenant=Z.tenant)
    (leased,), _ = q.zones.dequeue(Z, 1, 1_000)
    extended = q.zones.extend_lease(Z, item_id, str(leased.lease_id), 60_000)
    assert extended.vesting_ms > leased.vesting_ms
    assert q.zones.complete_many(Z, [(item_id, str(leased.lease_id))]) == [None]
    assert q.zones.get(Z, item_id) is None and q.zones.count(Z) == 0
    # The zone's order index holds nothing of it (its entry moved at the extension).
    assert q.zones.dequeue(Z, 1, 1_000)[0] == []
