"""Queue zones over the KV seam (paper section 5): the KV implementation of ZoneStore.

A zone keeps, per item, a record and an order-index entry keyed by (priority, vesting,
item_id), plus a count kept with atomic adds. A lease is the item's vesting time moved into
the future with a fresh random lease id. Peek walks the order index one priority at a time
and reads only vested entries, so its cost does not grow with delayed or leased items.

FIFO items (enqueued with ``fifo`` and no delay) are keyed instead by (priority, commit
versionstamp, seq, item_id): the store's commit order, not the producers' clocks, orders
them. Their entries sort after the priority's vesting-keyed ones, so peek reads the vested
vesting-keyed entries (retries, delayed items, expired leases: work that has waited) and
then the FIFO entries, each a bounded range read. Their first lease re-keys them by vesting
time, as any lease does.

One class, :class:`KVZoneStore`, written in parts by job: :mod:`.items` (an item's keys),
:mod:`.writes` (the enqueue's item half), :mod:`.reads`, :mod:`.leases`, :mod:`.dequeue`,
:mod:`.completion`, :mod:`.dead_letters` and :mod:`.progress` (a handler's progress).
"""

from __future__ import annotations

from quickzones.store.zones.completion import ZoneCompletion
from quickzones.store.zones.dequeue import ZONE_PREFETCH_KEYS, ZoneDequeue
from quickzones.store.zones.items import (
    CHUNK_SIZE,
    INLINE_PAYLOAD_LIMIT,
    check_lease_duration,
    new_item_id,
    new_lease_id,
)
from quickzones.store.zones.progress import ZoneProgress
from quickzones.store.zones.writes import ZoneWrites
from quickzones.store.zonestore import ZoneStoreCapabilities

__all__ = [
    "CHUNK_SIZE",
    "INLINE_PAYLOAD_LIMIT",
    "ZONE_PREFETCH_KEYS",
    "KVZoneStore",
    "check_lease_duration",
    "new_item_id",
    "new_lease_id",
]


class KVZoneStore(ZoneWrites, ZoneDequeue, ZoneCompletion, ZoneProgress):
    """Zones whose items live in the same KV store as their pointers.

    Every method that takes ``tr`` runs inside it and never commits; without one it runs in
    its own transaction through :func:`quickzones.store.kv.run`.
    """

    # Items share the pointers' KV store, so everything a transaction can do is possible.
    capabilities: ZoneStoreCapabilities = ZoneStoreCapabilities(
        transactional_handlers=True,
        fifo=True,
        local_items=True,
        caller_transactions=True,
        outcome_records=True,
        one_transaction_visits=True,
        lookahead_dequeue=True,
        batches=True,
        flow_keys=True,
    )
