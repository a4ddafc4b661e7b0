"""CassandraQuick: the Quick surface (jobs, enqueue, consumers) over Cassandra items.

Items live in Cassandra, pointers in a KV store (``fdb://`` in production; ``sqlite://``
or ``memory://`` for one machine and tests). Everything else (registry, consumer wiring,
limits, the top-level queue) is Quick's own; only the zone store differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from adapters.cassandra.driver import connect
from adapters.cassandra.store import NO_FIFO, CassandraZoneStore
from adapters.cassandra.url import CassandraURL, parse_cassandra_url
from quick_core.client import Quick
from quick_core.clock import Clock
from quick_core.errors import ConfigurationError
from quick_core.kv import KVStore, KVTransaction
from quick_core.records import DeadLetter, WorkItem
from quick_core.registry import Handler
from quick_core.urls import open_kv
from quick_core.validation import check_name
from quick_core.zonestore import ZoneStore

T = TypeVar("T")


class CassandraQuick(Quick):
    """A QuiCK deployment whose work items live in Cassandra (paper section 6.1).

    Enqueues are the two-step external-store enqueue (Cassandra write, then the pointer
    transaction); they cannot join a caller's KV transaction, and handlers cannot be
    transactional (exactly-once needs the item's delete in the handler's transaction).
    """

    def __init__(
        self,
        kv: KVStore,
        session: Any,
        url: CassandraURL,
        *,
        owner: Any = None,
        **options: Any,
    ) -> None:
        if options.get("fifo"):
            raise ConfigurationError(NO_FIFO)
        super().__init__(kv, **options)
        self.cassandra_url = url
        self.items = CassandraZoneStore(
            session,
            url.keyspace,
            kv,
            self.toplevel,
            table=url.table,
            consistency=url.consistency,
            serial_consistency=url.serial_consistency,
            timeout_s=url.timeout_s,
            clock=self.clock,
            owner=owner,
        )

    def close(self) -> None:
        self.items.close()
        super().close()

    def item_store(self) -> ZoneStore:
        return self.items

    def job(self, name: str, **options: Any) -> Callable[[Handler], Handler]:
        if options.get("transactional"):
            raise ConfigurationError(
                f"job type {name!r}: transactional handlers need KV zones; with Cassandra "
                "zones an item's delete cannot commit with the handler's transaction"
            )
        return super().job(name, **options)

    def enqueue(
        self,
        job_type: str,
        payload: Any = b"",
        *,
        app: str,
        tenant: str,
        delay: float = 0.0,
        priority: int = 0,
        item_id: str | None = None,
        ttl: float | None = None,
        tr: KVTransaction | None = None,
        fifo: bool | None = None,
    ) -> str:
        """Write the item to Cassandra, then ensure the zone's pointer in one KV
        transaction (which also charges the app's enqueue rate). On failure the item is
        collected and the error raised. ``item_id`` makes a retry idempotent."""
        zone = self.zone(app, tenant)
        new = self._new_item(job_type, payload, delay, priority, item_id, ttl, fifo)
        return self.items.enqueue(
            zone,
            new,
            tr=tr,
            in_pointer_txn=lambda t: self.limits.charge_enqueue(t, zone.app),
        )

    def enqueue_many(
        self,
        job_type: str,
        payloads: Iterable[Any],
        *,
        app: str,
        tenant: str,
        delay: float = 0.0,
        priority: int = 0,
        fifo: bool | None = None,
    ) -> list[str]:
        """One enqueue per payload (each its own Cassandra write and pointer check)."""
        return [
            self.enqueue(
                job_type, p, app=app, tenant=tenant, delay=delay, priority=priority, fifo=fifo
            )
            for p in payloads
        ]

    def enqueue_local(
        self, job_type: str, payload: Any = b"", *, shard: int = 0, delay: float = 0.0
    ) -> str:
        raise ConfigurationError("local work items need KV zones; use a Quick for them")

    def transact(self, fn: Callable[[KVTransaction], T]) -> T:
        raise ConfigurationError(
            "Cassandra zones cannot enqueue inside a KV transaction; call enqueue() on its own"
        )

    def get(self, app: str, tenant: str, item_id: str) -> WorkItem | None:
        return self.items.get(self.zone(app, tenant), item_id)

    def cancel(self, app: str, tenant: str, item_id: str) -> None:
        self.items.cancel(self.zone(app, tenant), check_name("item_id", item_id))

    def count(self, app: str, tenant: str) -> int:
        return self.items.count(self.zone(app, tenant))

    def dead_letters(self, app: str | None = None, tenant: str | None = None) -> list[DeadLetter]:
        if app is None or tenant is None:
            raise ConfigurationError("Cassandra dead letters are listed per zone (app, tenant)")
        return self.items.dead_letters(self.zone(app, tenant))

    def requeue_dead_letter(self, app: str, tenant: str, item_id: str) -> str:
        zone = self.zone(app, tenant)
        for dead in self.items.dead_letters(zone):
            if dead.item_id == item_id and dead.item is not None:
                new_id = self.enqueue(
                    dead.item.job_type,
                    dead.item.payload,
                    app=app,
                    tenant=tenant,
                    priority=dead.item.priority,
                    item_id=item_id,
                )
                self.items.purge_dead_letter(zone, item_id)
                return new_id
        from quick_core.errors import ItemNotFound

        raise ItemNotFound(item_id)


def open_cassandra_quick(
    cassandra_url: str,
    pointer_store_url: str,
    *,
    clock: Clock | None = None,
    **options: Any,
) -> CassandraQuick:
    """Open a deployment with items in Cassandra and pointers in a KV store.

    ``cassandra://h1,h2:9042/keyspace?consistency=QUORUM`` names the items (the table must
    exist: ``quick cassandra init``); ``pointer_store_url`` the top-level queue
    (``fdb://``, ``sqlite:///path``, ``memory://``). ``options`` go to :class:`Quick`.
    """
    url = parse_cassandra_url(cassandra_url)
    kv = open_kv(pointer_store_url, clock=clock)
    try:
        cluster, session = connect(url)
    except BaseException:
        kv.close()
        raise
    try:
        return CassandraQuick(kv, session, url, owner=cluster, clock=clock, **options)
    except BaseException:
        cluster.shutdown()
        kv.close()
        raise
