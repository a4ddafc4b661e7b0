"""Pointer garbage collection (paper section 6, the end of a Manager's visit in Algorithm 2).

A pointer whose zone has been empty for ``min_inactive`` is deleted, so the top-level queue
holds pointers only to zones that may have work. The delete is safe against a racing
enqueue only because its transaction reads the pointer index key and observes the whole
zone empty (invariant 2): an enqueue that commits first makes the zone non-empty, one that
commits later conflicts on the index key and creates a fresh pointer.

The deletion for a tenant move (the source zone emptied by the move, not by consumers)
is :meth:`quickzones.store.toplevel.TopLevelQueue.drop_pointer_if_empty`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from quickzones.clock import now_ms
from quickzones.store.kv import KVTransaction
from quickzones.store.records import Pointer

if TYPE_CHECKING:
    from quickzones.store.toplevel import TopLevelQueue


def collect_pointer_if_inactive(
    tr: KVTransaction,
    toplevel: TopLevelQueue,
    shard: int,
    pointer: Pointer,
    *,
    last_active_ms: int,
    min_inactive_ms: int,
    zone_is_empty: Callable[[KVTransaction], bool],
    now: int | None = None,
) -> bool:
    """Delete ``pointer`` (its record, vesting entry and index entry) inside ``tr`` if its
    zone was last active ``min_inactive_ms`` or more before ``now`` (default: the clock's)
    and is empty; True if deleted.

    The caller found no vested or waiting item through the zone's minimum vesting time;
    ``zone_is_empty`` is the strong check (for Cassandra zones, a QUORUM/SERIAL read).
    """
    now = now_ms(toplevel.clock) if now is None else now
    if now - last_active_ms < min_inactive_ms:
        return False
    keys, cluster = toplevel.keys, toplevel.cluster
    index_key = keys.pointer_index_key(cluster, shard, pointer.zone)
    tr.get(index_key)  # a read: a racing enqueue's pointer check conflicts
    if not zone_is_empty(tr):
        return False
    tr.clear(keys.pointer_key(cluster, shard, pointer.pointer_id))
    tr.clear(keys.pointer_vesting_key(cluster, shard, pointer.vesting_ms, pointer.pointer_id))
    tr.clear(index_key)
    return True
