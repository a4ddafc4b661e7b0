"""Pull consumers choose zones as Algorithm 1 does (issue 27, point 2): a random fraction
of a window of vested pointers, so several pull consumers of one server spread over the
tenants instead of all contending for the oldest pointer."""

from __future__ import annotations

from quickzones.adapters.http.client import RemoteQuick
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.pull_leaser import PullLeaser

from .conftest import Served

TENANTS = 40
PER_TENANT = 5


def _oldest_tenants(q: Quick) -> set[str]:
    """The tenants whose pointers are the oldest vested ones (ties: all of them)."""
    top = q.toplevel
    now = now_ms(q.clock)
    vested = [p for s in range(top.shards) for p in top.list_pointers(s) if p.vesting_ms <= now]
    first = min(p.vesting_ms for p in vested)
    return {p.zone.tenant for p in vested if p.vesting_ms == first}


def test_pull_consumers_spread_over_zones_not_the_oldest_pointer(served: Served) -> None:
    """A backlog over 40 tenants. Four pull consumers lease one item at a time, in turn.
    On the code before this change every lease went to the zone of the oldest vested
    pointer (40 of 40 on memory and sqlite), so pull consumers leasing at the same time
    all raced for that one pointer's lease; chosen as Algorithm 1 chooses (a random
    fraction of the vested pointers), the leases spread over the tenants."""
    q = served.q
    for n in range(TENANTS):
        q.enqueue_many("j", list(range(PER_TENANT)), app="a", tenant=f"t{n:02}")
    clients = [RemoteQuick(served.url, served.a_all) for _ in range(4)]
    took_oldest = 0
    tenants: list[str] = []
    try:
        for _ in range(10):
            for client in clients:
                oldest = _oldest_tenants(q)
                (lease,) = client.lease(max_items=1, wait_s=2, lease_s=60)
                took_oldest += lease.tenant in oldest
                tenants.append(lease.tenant)
    finally:
        for client in clients:
            client.close()
    assert took_oldest <= 20, (took_oldest, tenants)


def test_an_in_order_leaser_takes_the_oldest_pointer_first() -> None:
    """``in_order=True`` (the in-order scanner's rule): the oldest vested pointer first."""
    q = Quick.open("memory://")
    try:
        for n in range(10):
            q.enqueue("j", n, app="a", tenant=f"t{n}")
        leaser = PullLeaser(q, ConsumerConfig(in_order=True))
        for n in range(3):
            oldest = _oldest_tenants(q)
            (got,) = leaser.lease_once("a", 1, 60)
            assert got.zone.tenant in oldest, (n, oldest)
    finally:
        q.close()


def test_pull_leases_read_the_consumer_config_visit_max() -> None:
    """The leaser reads ``visit_max`` from its ConsumerConfig (before: PullConfig repeated
    ``dequeue_max`` and had no ``visit_max``, so a lone tenant's lease of 20 got 2 items
    with dequeue_max=2): a lone tenant's zone gives the whole request in one visit, by
    default and with a ``visit_max`` above it; ``visit_max=dequeue_max``, the paper's
    visits, gives ``dequeue_max``."""
    q = Quick.open("memory://")
    try:
        q.enqueue_many("j", list(range(60)), app="a", tenant="alone")
        papers = PullLeaser(q, ConsumerConfig(dequeue_max=2, visit_max=2))
        assert len(papers.lease_once("a", 20, 60)) == 2
        conserving = PullLeaser(q, ConsumerConfig(dequeue_max=2, visit_max=50))
        assert len(conserving.lease_once("a", 20, 60)) == 20
        default = PullLeaser(q, ConsumerConfig(dequeue_max=2))
        assert len(default.lease_once("a", 20, 60)) == 20
    finally:
        q.close()


def test_a_garbage_pointer_does_not_stop_pull_leases(served: Served) -> None:
    """A pointer record that cannot be decoded (issue 27, point 1.5) through ``quick serve``:
    the pull leaser's window read it and raised, so every lease of the app failed (500)
    while the record stayed. Now it is set aside and rebuilt as a local consumer's lease
    would, and the zone's items are leased."""
    q = served.q
    q.enqueue_many("j", [1, 2], app="a", tenant="spoilt")
    q.enqueue("j", 3, app="a", tenant="fine")
    zone = q.zone("a", "spoilt")
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None
    key = q.keys.pointer_key(q.toplevel.cluster, q.toplevel.shard_for(zone), pointer.pointer_id)
    q.transact(lambda tr: tr.set(key, b"\xc1 not msgpack"))
    client = RemoteQuick(served.url, served.a_all)
    got: list[object] = []
    try:
        for _ in range(6):
            got += [lease.payload for lease in client.lease(max_items=3, wait_s=0.5, lease_s=60)]
            if len(got) == 3:
                break
    finally:
        client.close()
    assert sorted(got) == [1, 2, 3]  # type: ignore[type-var]
