"""Quick receives its zone store and checks the store's capabilities once, with one clear
error naming the capability and the store (issue 13.6)."""

from __future__ import annotations

import pytest

from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ConfigurationError, UnsupportedByStore
from quickzones.store.records import ZoneId
from quickzones.store.zones import KVZoneStore
from quickzones.store.zonestore import ZoneStoreCapabilities

Z = ZoneId("app", "t1")


class PlainZones(KVZoneStore):
    """A zone store that declares none of the optional capabilities."""

    capabilities = ZoneStoreCapabilities()


def _plain(q: Quick) -> PlainZones:
    return PlainZones(q.kv, q.toplevel, keys=q.keys, clock=q.clock)


@pytest.fixture
def pq() -> Quick:
    return Quick(MemoryStore(clock=ManualClock()), clock=ManualClock(), zone_store=_plain)


def _refused(err: pytest.ExceptionInfo[UnsupportedByStore], capability: str) -> None:
    assert isinstance(err.value, ConfigurationError)
    assert err.value.capability == capability and err.value.store == "PlainZones"
    assert capability in str(err.value) and "PlainZones" in str(err.value)


def test_injected_zone_store_serves_items_and_consumers(pq: Quick) -> None:
    assert isinstance(pq.items, PlainZones) and pq.item_store() is pq.items
    ran: list[bytes] = []
    pq.job("job")(lambda payload, ctx: ran.append(payload))
    pq.enqueue("job", b"a", app=Z.app, tenant=Z.tenant)
    assert pq.enqueue_many("job", [b"b", b"c"], app=Z.app, tenant=Z.tenant)
    assert pq.run_until_idle() == 3 and sorted(ran) == [b"a", b"b", b"c"]


def test_transactional_handler_refused_at_registration(pq: Quick) -> None:
    with pytest.raises(UnsupportedByStore) as err:
        pq.job("tx", transactional=True)
    _refused(err, "transactional_handlers")
    assert pq.registry.find("tx") is None


def test_enqueue_into_caller_transaction_refused_before_writing(pq: Quick) -> None:
    tr = pq.kv.create_transaction()
    with pytest.raises(UnsupportedByStore) as err:
        pq.enqueue("job", b"", app=Z.app, tenant=Z.tenant, tr=tr)
    _refused(err, "caller_transactions")
    tr.commit()
    assert pq.zones.count(Z) == 0 and pq.toplevel.get_pointer(Z) is None


def test_fifo_refused_per_call_and_per_client(pq: Quick) -> None:
    with pytest.raises(UnsupportedByStore) as err:
        pq.enqueue("job", b"", app=Z.app, tenant=Z.tenant, fifo=True)
    _refused(err, "fifo")
    assert pq.zones.count(Z) == 0
    with pytest.raises(UnsupportedByStore, match="fifo"):
        Quick(MemoryStore(), zone_store=_plain, fifo=True)


def test_local_items_refused(pq: Quick) -> None:
    with pytest.raises(UnsupportedByStore) as err:
        pq.enqueue_local("sweep", b"")
    _refused(err, "local_items")


def test_kv_zones_support_everything() -> None:
    q = Quick(MemoryStore())
    assert q.capabilities == ZoneStoreCapabilities(True, True, True, True)
    q.job("tx", transactional=True)(lambda payload, ctx: None)
    q.transact(lambda tr: q.enqueue("tx", b"", app=Z.app, tenant=Z.tenant, tr=tr, fifo=True))
    q.enqueue_local("sweep", b"")
