"""CassandraZoneStore: queue zones whose items live in Cassandra (paper section 6.1).

Pointers stay in the KV store (FoundationDB in production); items live in one Cassandra
partition per zone (see :mod:`quickzones.adapters.cassandra.schema`). Every change to an item is a
lightweight transaction: a conditional batch on the item row ``IF lease_id = ? AND
vesting_ms = ?`` (the state the caller read) that also moves the item's order entry. The
pair (lease_id, vesting_ms) changes on every transition, so two consumers can never both
take the same item, and a stale reader's write is refused instead of applied.

A write that times out after it was sent may or may not have been applied. It is never
guessed: the item is re-read at SERIAL (which finishes any in-progress Paxos round) and
the outcome read off the row; if that read fails too, a :class:`CassandraError` with
``outcome_unknown`` is raised and the item's lease simply expires. No timeout turns into a
lost item.

The store is assembled from its parts, one module each: the conditional change of one
item (:mod:`~quickzones.adapters.cassandra.plans`), the enqueue (``enqueue``), the reads
(``reads``), the pointer transactions' reads (``pointer_side``), item leases (``leases``),
completion (``completion``) and dead letters (``dead_letters``).
"""

from __future__ import annotations

from typing import Any

from quickzones.adapters.cassandra.completion import Completion
from quickzones.adapters.cassandra.enqueue import NO_FIFO, ExternalEnqueue
from quickzones.adapters.cassandra.leases import ItemLeases
from quickzones.adapters.cassandra.plans import CAS_ATTEMPTS, TRACEBACK_META, Plan
from quickzones.adapters.cassandra.pointer_side import PointerSide
from quickzones.adapters.cassandra.table import ZoneTable
from quickzones.clock import Clock, SystemClock
from quickzones.store.ids import IdSource
from quickzones.store.kv import KVStore
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.zonestore import ZoneStoreCapabilities

__all__ = ["CAS_ATTEMPTS", "NO_FIFO", "TRACEBACK_META", "CassandraZoneStore", "Plan"]


class CassandraZoneStore(ExternalEnqueue, PointerSide, ItemLeases, Completion):
    """The :class:`~quickzones.store.zonestore.ZoneStore` over Cassandra, pointers over ``kv``.

    ``session`` is a connected cassandra-driver Session; ``keyspace`` holds the table made
    by :func:`quickzones.adapters.cassandra.schema.init_schema`. Plain reads and writes use
    ``consistency`` (QUORUM by default); lightweight transactions and the reads that must
    observe them use ``serial_consistency`` (SERIAL).
    """

    # An item's Cassandra write cannot join a KV transaction: no transactional handlers, no
    # enqueue inside a caller's transaction, no commit-versionstamp order, and local work
    # items stay in KV zones.
    capabilities: ZoneStoreCapabilities = ZoneStoreCapabilities()

    def __init__(
        self,
        session: Any,
        keyspace: str,
        kv: KVStore,
        toplevel: TopLevelQueue,
        *,
        table: str = "zone_rows",
        consistency: str = "QUORUM",
        serial_consistency: str = "SERIAL",
        timeout_s: float = 10.0,
        clock: Clock | None = None,
        owner: Any = None,
        ids: IdSource | None = None,
    ) -> None:
        self.session = session
        self.keyspace = keyspace
        self.table = ZoneTable(
            session,
            keyspace,
            table,
            consistency=consistency,
            serial_consistency=serial_consistency,
            timeout_s=timeout_s,
        )
        self.kv = kv
        self.toplevel = toplevel
        self.clock = clock or SystemClock()
        self.ids = ids or toplevel.ids
        self._owner = owner  # a Cluster this store opened and must shut down

    def close(self) -> None:
        if self._owner is not None:
            self._owner.shutdown()
            self._owner = None
