"""CassandraQuick: the Quick surface (jobs, enqueue, consumers) over Cassandra items.

Items live in Cassandra, pointers in a KV store (``fdb://`` in production; ``sqlite://``
or ``memory://`` for one machine and tests). Everything else (registry, consumer wiring,
limits, the top-level queue) is Quick's own; only the zone store differs.
"""

from __future__ import annotations

from typing import Any

from quickzones.adapters.cassandra.driver import connect
from quickzones.adapters.cassandra.store import NO_FIFO, CassandraZoneStore
from quickzones.adapters.cassandra.url import CassandraURL, parse_cassandra_url
from quickzones.client import Quick
from quickzones.clock import Clock
from quickzones.errors import ConfigurationError, ItemNotFound, UnsupportedByStore
from quickzones.store.admin import Requeued
from quickzones.store.kv import KVStore
from quickzones.store.records import DeadLetter
from quickzones.urls import open_kv


class CassandraQuick(Quick):
    """A QuiCK deployment whose work items live in Cassandra (paper section 6.1).

    A :class:`Quick` with a :class:`CassandraZoneStore` injected: enqueues are the
    external-store enqueue (Cassandra write, then the pointer transaction). What Cassandra
    zones cannot do (join a caller's KV transaction, transactional handlers, FIFO, local
    items) is refused by ``Quick`` from the store's capabilities, not here.
    """

    items: CassandraZoneStore

    def __init__(
        self,
        kv: KVStore,
        session: Any,
        url: CassandraURL,
        *,
        owner: Any = None,
        **options: Any,
    ) -> None:
        if options.get("fifo") and not CassandraZoneStore.capabilities.fifo:
            # Before the store is built: nothing is opened for a deployment that cannot run.
            raise UnsupportedByStore(
                "FIFO ordering (fifo=True)", "fifo", "CassandraZoneStore", NO_FIFO
            )
        self.cassandra_url = url

        def items(q: Quick) -> CassandraZoneStore:
            return CassandraZoneStore(
                session,
                url.keyspace,
                q.kv,
                q.toplevel,
                table=url.table,
                consistency=url.consistency,
                serial_consistency=url.serial_consistency,
                timeout_s=url.timeout_s,
                clock=q.clock,
                owner=owner,
            )

        super().__init__(kv, zone_store=items, **options)

    def close(self) -> None:
        self.items.close()
        super().close()

    def count(self, app: str, tenant: str) -> int:
        return self.items.count(self.zone(app, tenant))

    def dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        if app is None or tenant is None:
            raise ConfigurationError("Cassandra dead letters are listed per zone (app, tenant)")
        letters = [
            d
            for d in self.items.dead_letters(self.zone(app, tenant))
            if job_type is None or (d.item is not None and d.item.job_type == job_type)
        ]
        return letters[:limit]

    def requeue_dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> Requeued:
        """One zone's dead letters, one at a time (each enqueued, then removed)."""
        done = Requeued()
        for d in self.dead_letters(app, tenant, job_type=job_type):
            if d.item is None:
                done.corrupt.append(d)
            elif limit is None or done.requeued < limit:
                self.requeue_dead_letter(d.zone.app, d.zone.tenant, d.item_id)
                done.requeued += 1
        return done

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
