"""An enqueue on PostgreSQL answers part one's reads (the layout and the zone's pointer
index entry) from what this store read right after its last commit into the zone, and its
commit checks them against the snapshot they were read in (issue 42: one round trip an
enqueue), where the server does not make the pointer check itself
(``server_pointer_check=off``, or a role that may not add quick_ensure3). These are the
cases where what was kept is stale: another store object (another process) collected the
zone's pointer, or moved it, or changed the layout since. The commit's check fails, the
enqueue reads again and lands with its pointer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.store.kv import NOT_COMMITTED, KVError, KVTransaction, run
from quickzones.store.records import ZoneId
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)

Z = ZoneId("a", "t")


def _open(url: str) -> Quick:
    # Each enqueue reads its zone's pointer index entry (server_pointer_check=off): the
    # path where what the store kept answers that read.
    options = "listen=off&server_pointer_check=off"
    return Quick.open(f"{url}&{options}" if "?" in url else f"{url}?{options}")


@pytest.fixture
def two() -> Iterator[tuple[Quick, Quick, list[Any]]]:
    """Two Quick objects (two stores, as two processes) on one schema; the second's
    handler notes each payload it runs."""
    url = postgres_store_url()
    q, other = _open(url), _open(url)
    ran: list[Any] = []

    @other.job("job")
    def job(payload: Any, ctx: Any) -> None:
        ran.append(payload["n"])

    try:
        yield q, other, ran
    finally:
        q.close()
        other.close()


def _collect_pointer(q: Quick) -> None:
    """Delete ``Z``'s pointer as pointer collection does once the zone is empty."""
    top = q.toplevel

    def collect(tr: KVTransaction) -> None:
        pointer = top.get_pointer(Z, tr=tr)
        assert pointer is not None
        shard = top.shard_for(Z)
        keys = top.keys
        cluster, pid = top.cluster, pointer.pointer_id
        tr.get(keys.pointer_index_key(cluster, shard, Z))
        tr.clear(keys.pointer_key(cluster, shard, pid))
        tr.clear(keys.pointer_vesting_key(cluster, shard, pointer.vesting_ms, pid))
        tr.clear(keys.pointer_index_key(cluster, shard, Z))

    run(q.kv, collect)


def test_a_pointer_collected_by_another_process_is_made_again(
    two: tuple[Quick, Quick, list[Any]],
) -> None:
    q, other, ran = two
    for n in range(3):  # the zone, its pointer, and what the store kept of them
        q.enqueue("job", {"n": n}, app=Z.app, tenant=Z.tenant)
    assert other.run_until_idle() == 3
    _collect_pointer(other)
    assert q.toplevel.get_pointer(Z) is None
    q.enqueue("job", {"n": 3}, app=Z.app, tenant=Z.tenant)
    assert q.toplevel.get_pointer(Z) is not None
    assert other.run_until_idle() == 1
    assert ran == [0, 1, 2, 3]


def test_a_pointer_collected_then_made_again_elsewhere_is_read_again(
    two: tuple[Quick, Quick, list[Any]],
) -> None:
    """The pointer is collected and another process's enqueue makes a new one (another
    id): what this store kept names the old pointer, its commit fails the check and the
    enqueue reads the new entry (its part two looks at the new pointer)."""
    q, other, ran = two
    for n in range(3):
        q.enqueue("job", {"n": n}, app=Z.app, tenant=Z.tenant)
    assert other.run_until_idle() == 3
    _collect_pointer(other)
    other.enqueue("job", {"n": 3}, app=Z.app, tenant=Z.tenant)
    made = other.toplevel.get_pointer(Z)
    assert made is not None
    q.enqueue("job", {"n": 4}, app=Z.app, tenant=Z.tenant)
    assert q.toplevel.get_pointer(Z) == made
    assert other.run_until_idle() == 2
    assert sorted(ran) == [0, 1, 2, 3, 4]


def test_many_enqueues_beside_another_processs_drains_lose_nothing(
    two: tuple[Quick, Quick, list[Any]],
) -> None:
    """Each round: enqueue, drain elsewhere, collect the pointer; every item runs."""
    q, other, ran = two
    for n in range(12):
        q.enqueue("job", {"n": n}, app=Z.app, tenant=Z.tenant)
        assert other.run_until_idle() == 1
        if n % 3 == 2:
            _collect_pointer(other)
    assert ran == list(range(12))


def test_a_store_that_allows_no_retry_reads_every_time() -> None:
    """``kv.run`` counts every try: with ``retry_limit=0`` a try that failed only because
    what the store kept was stale would end the call, so such a store never uses it."""
    url = postgres_store_url()
    q = _open(f"{url}&retry_limit=0")
    other = _open(url)
    try:
        for n in range(3):
            q.enqueue("job", {"n": n}, app=Z.app, tenant=Z.tenant)
        _collect_pointer(other)
        q.enqueue("job", {"n": 3}, app=Z.app, tenant=Z.tenant)
        assert q.toplevel.get_pointer(Z) is not None
    finally:
        q.close()
        other.close()


def test_a_try_that_read_stale_kept_values_is_retried_at_once_and_uncounted(
    two: tuple[Quick, Quick, list[Any]],
) -> None:
    """Through the transaction's own retry loop (FoundationDB's ``on_error``): the failed
    try is no contention, so it neither backs off nor counts against ``set_retry_limit``,
    and the next try reads afresh."""
    q, other, _ = two
    for n in range(3):
        q.enqueue("job", {"n": n}, app=Z.app, tenant=Z.tenant)
    keys = [q.toplevel.layout_key, q.toplevel.index_key(Z)]
    _collect_pointer(other)
    tr = q.kv.create_transaction()
    tr.set_retry_limit(0)
    tr.set(b"\x15\x07mark", b"x")  # a write first, as part one writes its item first
    assert tr.get_many(keys)[1] is not None  # what the store kept: the old entry
    with pytest.raises(KVError) as failed:
        tr.commit()
    assert failed.value.code == NOT_COMMITTED
    tr.on_error(failed.value)  # within a retry limit of 0: not counted
    tr.set(b"\x15\x07mark", b"x")
    assert tr.get_many(keys)[1] is None  # read afresh: the pointer was collected
    tr.commit()


def test_a_snapshot_many_commits_behind_is_not_used() -> None:
    """A zone enqueued into again after other zones' enqueues (a small tenant's usual
    enqueue) had its reads answered from a snapshot hundreds of commits old, so its
    commit's check read every one of those commits' log rows on the server (300 rows,
    3-4 ms, its locks held meanwhile). Past MOST_BEHIND commits it reads afresh."""
    from quickzones.backends.postgres.known_reads import MOST_BEHIND, KnownReads, Seen

    known = KnownReads(fresh_s=60.0)
    seen = Seen("10:10:", 100, 0.0, {b"layout": b"x", b"index": b"p"})
    known.learned(seen)
    assert known.lookup([b"layout", b"index"], 1.0) is seen
    known.noted(100 + MOST_BEHIND)
    assert known.lookup([b"layout", b"index"], 1.0) is seen
    known.noted(100 + MOST_BEHIND + 1)
    assert known.lookup([b"layout", b"index"], 1.0) is None


def test_an_enqueue_after_many_other_commits_reads_afresh() -> None:
    """The store notes its commits' versions: after more than MOST_BEHIND enqueues into
    other zones, what it kept of ``Z`` is not used; the enqueue lands all the same."""
    from quickzones.backends.postgres.known_reads import MOST_BEHIND

    q = _open(postgres_store_url())
    try:
        for n in range(2):  # the second keeps what it read (the first made the pointer)
            q.enqueue("job", {"n": n}, app=Z.app, tenant=Z.tenant)
        top = q.toplevel
        keys = [top.layout_key, top.keys.pointer_index_key(top.cluster, top.shard_for(Z), Z)]
        now = q.kv.clock.now()
        assert q.kv.known.lookup(keys, now) is not None
        for n in range(MOST_BEHIND + 1):
            q.enqueue("job", {"n": n}, app=Z.app, tenant=f"other-{n}")
        assert q.kv.known.lookup(keys, q.kv.clock.now()) is None
        q.enqueue("job", {"n": 2}, app=Z.app, tenant=Z.tenant)
        assert q.zones.count(Z) == 3
    finally:
        q.close()
