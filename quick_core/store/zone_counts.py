"""A zone's item count: atomic adds, read as the sum of the count's shards.

Quick's own commits add to shard 0, the key every release reads and writes
(``KeySpace.count_key``). PostgreSQL keeps a row that a transaction updated locked until
that transaction ends, so a commit into an application's own open transaction
(``enqueue_on``) that added to that key would make every consumer's add (each
completion's, each dequeue's) and every other request's enqueue into the zone wait for the
application's COMMIT (issue 42 point 1). Such a commit adds to a shard from 1 to
``COUNT_SHARDS - 1`` instead: each of the process's next in turn, from a random one, so up
to 15 of one process's open requests into a zone never share a shard. Readers sum the
shards, one short range read. A zone that empties is collected with every shard
(``ZoneReads.zone_is_empty``).

A process of a release before this one reads shard 0 alone: during a rolling upgrade its
counts (admin pages, metrics) miss what open application transactions added; its pointer
collection sees the other shards as items and leaves such a zone's pointer for a new
process to collect.
"""

from __future__ import annotations

import itertools
import random

from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVTransaction, joins_application, pack_i64, unpack_i64
from quickzones.store.records import ZoneId

COUNT_SHARDS = 16
# The next application commit's shard, less one (a process's turns start at random, so
# processes spread too).
_turns = itertools.count(random.randrange(COUNT_SHARDS - 1))


def add(tr: KVTransaction, keys: KeySpace, zone: ZoneId, delta: int) -> None:
    """Add ``delta`` to the zone's count in ``tr``: one atomic add, no read."""
    shard = 1 + next(_turns) % (COUNT_SHARDS - 1) if joins_application(tr) else 0
    tr.add(keys.count_key(zone, shard), pack_i64(delta))


def read(tr: KVTransaction, keys: KeySpace, zone: ZoneId) -> int:
    """The zone's count as ``tr`` sees it (a snapshot read: no conflict)."""
    return sum(unpack_i64(v) for _, v in tr.get_range(*keys.count_range(zone), snapshot=True))
