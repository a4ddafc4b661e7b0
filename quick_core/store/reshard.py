"""Resharding a top-level queue online (``quick reshard``): change how many shards its
pointers are spread over while producers and consumers run, losing no pointer.

Three steps, each a transaction (or many) over the KV seam:

1. **Begin**: the stored layout gets a ``target`` and a new epoch
   (:mod:`quickzones.store.layout`). Every enqueue reads the layout with a conflict, so
   the ones in flight abort and retry; from then on they look for a zone's pointer under
   both counts and make new ones under the target. Consumers poll the shards of both.
2. **Move**: the pointer index of every old shard is scanned (snapshot reads); each pointer
   whose home under the target is elsewhere is moved -- record, vesting entry, index entry,
   lease and all -- in a transaction that reads its index entry and record with conflicts
   (so a racing enqueue, lease, requeue or collection either commits first and is moved
   with it, or conflicts and retries against the moved pointer). A leased pointer moves
   with its lease: its holder finds it in its new shard (``TopLevelQueue._locate``), or,
   if it lost track, the lease runs out and the pointer vests again there.
3. **Flip**: after a pass over every old shard that moved nothing, the layout becomes the
   target (no target, a new epoch). Nothing makes a pointer outside its target home once
   step 1 committed, so the pass cannot miss one.

A reshard interrupted at any point is resumed by running it again with the same count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quickzones.errors import ConfigurationError, UnsupportedByStore
from quickzones.store.kv import KVTransaction, key_after, run
from quickzones.store.layout import (
    Layout,
    check_shards,
    find_misplaced,
    read_layout,
    write_layout,
)
from quickzones.store.toplevel import TopLevelQueue

BATCH = 25  # index entries scanned per move transaction: small, so conflicts stay cheap


class ReshardUnderWay(ConfigurationError):
    """Another reshard of the cluster is under way to a different shard count."""

    def __init__(self, cluster: str, layout: Layout, requested: int) -> None:
        super().__init__(
            f"cluster {cluster!r} is {layout.describe()}: finish that first "
            f"(quick reshard --shards {layout.target}), then reshard to {requested}"
        )
        self.layout = layout
        self.requested = requested


@dataclass(frozen=True, slots=True)
class ReshardReport:
    """What a reshard did: from and to how many shards, pointers moved, passes made."""

    old_shards: int
    shards: int
    moved: int
    passes: int


def reshard(
    toplevel: TopLevelQueue,
    shards: int,
    *,
    batch: int = BATCH,
    on_pass: Callable[[int, int], None] | None = None,
) -> ReshardReport:
    """Change ``toplevel``'s shard count to ``shards`` online (see the module's page).

    ``on_pass(pass_number, moved)`` is told after each pass. Raises
    :class:`ReshardUnderWay` if another reshard to another count is under way; a no-op
    when the layout already has ``shards``.
    """
    check_shards(shards)
    if not toplevel.reshards:
        raise UnsupportedByStore(
            "resharding", "reshards", type(toplevel).__name__,
            "its pointers cannot move between shards yet; nothing was changed",
        )  # fmt: skip
    layout = run(toplevel.kv, lambda tr: _begin(tr, toplevel, shards))
    toplevel.layout = layout
    old = layout.shards
    if not layout.moving:
        return ReshardReport(old, shards, 0, 0)
    moved = passes = 0
    while True:
        passes += 1
        this_pass = sum(_move_shard(toplevel, layout, s, batch) for s in range(old))
        moved += this_pass
        if on_pass is not None:
            on_pass(passes, this_pass)
        if this_pass == 0:
            break
    toplevel.layout = run(toplevel.kv, lambda tr: _flip(tr, toplevel, layout))
    return ReshardReport(old, shards, moved, passes)


def _begin(tr: KVTransaction, toplevel: TopLevelQueue, shards: int) -> Layout:
    keys, cluster = toplevel.keys, toplevel.cluster
    stored = read_layout(tr, keys, cluster)
    if stored is None:
        # A store that never stored a layout: what it was used with must be what its
        # pointers say (layout.open_layout checks the same before a first write).
        stored = toplevel.layout
        misplaced = find_misplaced(tr, keys, cluster, stored.shards)
        if misplaced is not None:
            raise ConfigurationError(
                f"cluster {cluster!r} has no stored layout and a pointer in shard "
                f"{misplaced[0]} that {stored.describe()} would not put there: open it "
                "once with the shards it was used with (shards=N) first"
            )
    if stored.moving:
        if stored.target != shards:
            raise ReshardUnderWay(cluster, stored, shards)
        return stored
    if stored.shards == shards:
        return stored
    moving = Layout(stored.shards, stored.epoch + 1, target=shards)
    write_layout(tr, keys, cluster, moving)
    return moving


def _move_shard(toplevel: TopLevelQueue, layout: Layout, shard: int, batch: int) -> int:
    """Move the misplaced pointers of one old shard, ``batch`` index entries a
    transaction; how many moved."""
    keys, cluster = toplevel.keys, toplevel.cluster
    begin, end = keys.pointer_index_range(cluster, shard)
    moved = 0
    while True:

        def step(tr: KVTransaction, begin: bytes = begin) -> tuple[int, bytes | None]:
            if read_layout(tr, keys, cluster) != layout:
                raise ConfigurationError(
                    f"the layout of cluster {cluster!r} changed while resharding it"
                )
            rows = tr.get_range(begin, end, limit=batch, snapshot=True)
            n = 0
            for key, _ in rows:
                zone = keys.unpack_pointer_index_key(cluster, shard, key)
                if layout.home(zone) != shard:
                    n += toplevel.move_pointer(zone, shard, layout.home(zone), tr=tr)
            after = key_after(rows[-1][0]) if len(rows) == batch else None
            return n, after

        n, after = run(toplevel.kv, step)
        moved += n
        if after is None:
            return moved
        begin = after


def _flip(tr: KVTransaction, toplevel: TopLevelQueue, layout: Layout) -> Layout:
    stored = read_layout(tr, toplevel.keys, toplevel.cluster)
    if stored != layout:  # another run of the same reshard flipped it already
        return stored if stored is not None else layout
    assert layout.target is not None
    done = Layout(layout.target, layout.epoch + 1)
    write_layout(tr, toplevel.keys, toplevel.cluster, done)
    return done
