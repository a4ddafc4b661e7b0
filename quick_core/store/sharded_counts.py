"""Counters kept by atomic adds and read as the sum of their shards: a zone's item count
(``KeySpace.count_key``) and an app's enqueues in a minute (``AppLimits``'s rate).

Quick's own commits add to shard 0, the counter's key itself, which every release reads
and writes. PostgreSQL keeps a row a transaction updated locked until that transaction
ends, so a commit into an application's own open transaction (``enqueue_on``) that added
to that key would make every other commit adding to it wait for the application's COMMIT:
each completion and dequeue in the zone, every other request's enqueue into the zone, or,
for a rate-limited app, into any of its tenants (issue 42 point 1). Such a commit adds to
``key + (shard,)`` instead, shard 1 to ``SHARDS - 1``: each next in turn in the process,
from a random one, so up to 15 of one process's open requests never share one. A reader
sums the key and its shards, one short range read (snapshot: no conflict). A zone that
empties is collected with every shard (``ZoneReads.zone_is_empty``).

A process of a release before this one reads shard 0 alone: during a rolling upgrade its
counts (admin pages, metrics, the rate it checks) miss what open application transactions
added; its pointer collection sees a zone's other shards as items and leaves that zone's
pointer for a new process to collect.
"""

from __future__ import annotations

import itertools
import random

from quickzones.store.kv import KVTransaction, joins_application, pack_i64, unpack_i64
from quickzones.store.tuple_layer import fdbtuple

SHARDS = 16
# The next application commit's shard, less one (a process's turns start at random, so
# processes spread too).
_turns = itertools.count(random.randrange(SHARDS - 1))


def key_range(key: bytes) -> tuple[bytes, bytes]:
    """The counter ``key`` and every shard of it."""
    return key, key + b"\xff"


def add(tr: KVTransaction, key: bytes, delta: int) -> None:
    """Add ``delta`` to the counter ``key`` in ``tr``: one atomic add, no read."""
    if joins_application(tr):
        key += fdbtuple.pack((1 + next(_turns) % (SHARDS - 1),))
    tr.add(key, pack_i64(delta))


def read(tr: KVTransaction, key: bytes) -> int:
    """The counter ``key`` as ``tr`` sees it (a snapshot read: no conflict)."""
    return sum(unpack_i64(v) for _, v in tr.get_range(*key_range(key), snapshot=True))
