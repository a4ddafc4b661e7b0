"""The layout of a top-level queue, stored with the queue: how many shards decide where a
zone's pointer lives.

    (root, "m", "layout", cluster) -> {"v": 1, "s": shards, "e": epoch, "t": target}

Every process on one store must agree on it: a producer that puts a zone's pointer in
shard 3 of 4 and a consumer that polls only shard 0 of 1 would leave the zone's items
unrun forever. So the first open stores it, an open that asks for another is refused
(:class:`LayoutMismatch`), and an open that asks for nothing uses it. An open that asks
for nothing on a cluster with no layout stores 1 shard as *assumed* (``"a"``): a later
open that asks for a count stores that one instead, if the cluster's pointers allow it.

The layout records are also the store's list of clusters, so they must agree on the
cluster too: a producer of cluster "default" and a consumer of "prod" on one store would
each see an empty queue, and nothing would run. An open of a cluster that has no layout
while the store already has others is refused (:class:`UnknownCluster`, naming them)
unless it asks for a new cluster (``Quick(..., new_cluster=True)``); a fresh store just
opens, with any cluster name.

``quick reshard`` (:mod:`quickzones.store.reshard`) changes it online. While it runs the
layout has a ``target``: a zone's pointer is in its shard under the old count or under the
target (:meth:`Layout.places`), new pointers are made under the target, consumers poll
both, and the layout flips to the target once no pointer is left where only the old count
put it. Each change bumps ``epoch``; enqueues read the record with a conflict, so a change
aborts the enqueues in flight and they retry under the new layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from quickzones.errors import ConfigurationError, CorruptRecord
from quickzones.store.keys import LOCAL_APP, KeySpace, shard_of, tuple_range
from quickzones.store.kv import KVTransaction, strinc
from quickzones.store.records import ZoneId
from quickzones.store.tuple_layer import fdbtuple

LAYOUT_VERSION = 1


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a cluster's pointers live: ``shards``, and during a reshard ``target``."""

    shards: int
    epoch: int = 0
    target: int | None = None  # set while a reshard moves pointers to this count
    # Stored by an open that asked for no count (1 shard): an open that asks for one
    # replaces it.
    assumed: bool = False

    @property
    def moving(self) -> bool:
        return self.target is not None

    @property
    def polled(self) -> int:
        """How many shards may hold pointers (0 .. polled-1): consumers poll them all."""
        return max(self.shards, self.target or 0)

    def home(self, zone: ZoneId) -> int:
        """The shard where a new pointer of ``zone`` is made."""
        return shard_for(zone, self.shards if self.target is None else self.target)

    def places(self, zone: ZoneId) -> tuple[int, ...]:
        """Every shard where ``zone``'s pointer may be: its home first, then (during a
        reshard) its shard under the old count."""
        home = self.home(zone)
        if self.target is None:
            return (home,)
        old = shard_for(zone, self.shards)
        return (home,) if old == home else (home, old)

    def describe(self) -> str:
        if self.target is None:
            return _shards(self.shards)
        return f"{_shards(self.shards)}, resharding to {self.target}"

    def accepts(self, requested: int) -> bool:
        """Whether an open that asks for ``requested`` shards agrees with this layout."""
        return requested in (self.shards, self.target)


def shard_for(zone: ZoneId, shards: int) -> int:
    """The shard of ``zone``'s pointer among ``shards``. A cluster's local zone keeps its
    items under the shard it was made for; its pointer lives there while that shard
    exists, and in shard ``k mod shards`` after a reshard to fewer."""
    if zone.app == LOCAL_APP:
        return int(zone.tenant.rpartition("/")[2]) % shards
    return shard_of(zone, shards)


class LayoutMismatch(ConfigurationError):
    """The store's top-level queue has another layout than the one asked for."""

    def __init__(self, cluster: str, stored: Layout, requested: int) -> None:
        super().__init__(
            f"cluster {cluster!r} of this store is laid out in {stored.describe()}, "
            f"not the {_shards(requested)} asked for: open it without shards= to use "
            f"the stored layout, or change it with quick reshard --shards {requested}"
        )
        self.cluster = cluster
        self.stored = stored
        self.requested = requested


class UnknownCluster(ConfigurationError):
    """An open of a cluster the store does not have, while it has others."""

    def __init__(self, cluster: str, stored: list[str]) -> None:
        names = ", ".join(repr(name) for name in stored)
        super().__init__(
            f"this store has no cluster {cluster!r}; its clusters: {names}. A producer and "
            f"a consumer of different clusters never see each other's work: open it with "
            f"cluster={stored[0]!r} (Quick.open(url, cluster=...), in the app module for "
            f"quick worker), or pass new_cluster=True to start cluster {cluster!r} beside "
            f"{'it' if len(stored) == 1 else 'them'}"
        )
        self.cluster = cluster
        self.stored = stored


class UnrecordedShards(ConfigurationError):
    """A store without a stored layout holds pointers placed for another shard count."""

    def __init__(self, cluster: str, requested: int, shard: int, zone: ZoneId | None) -> None:
        where = f"shard {shard}" if zone is None else f"shard {shard} (zone {zone})"
        super().__init__(
            f"cluster {cluster!r} of this store has no stored layout and holds a pointer in "
            f"{where} that {_shards(requested)} would not put there: open it once with the "
            f"shards it was used with (shards=N), then change them with quick reshard"
        )
        self.cluster = cluster
        self.requested = requested
        self.shard = shard


def encode_layout(layout: Layout) -> bytes:
    obj: dict[str, Any] = {"v": LAYOUT_VERSION, "s": layout.shards, "e": layout.epoch}
    if layout.target is not None:
        obj["t"] = layout.target
    if layout.assumed:
        obj["a"] = True
    packed: bytes = msgpack.packb(obj)
    return packed


def decode_layout(key: bytes, raw: bytes) -> Layout:
    try:
        obj = msgpack.unpackb(raw)
        target = obj.get("t")
        layout = Layout(
            int(obj["s"]),
            int(obj["e"]),
            None if target is None else int(target),
            bool(obj.get("a", False)),
        )
    except Exception as err:  # msgpack raises several types; all mean the same here
        raise CorruptRecord(key, f"bad layout record: {err}") from err
    if layout.shards < 1 or (layout.target is not None and layout.target < 1):
        raise CorruptRecord(key, f"bad layout record: {layout}")
    return layout


def read_layout(
    tr: KVTransaction, keys: KeySpace, cluster: str, *, snapshot: bool = False
) -> Layout | None:
    """The stored layout of ``cluster``, or None (a store made before layouts were
    stored, or not opened for writing yet). Without ``snapshot`` the read conflicts with
    any layout change that commits first."""
    key = keys.layout_key(cluster)
    raw = tr.get(key, snapshot=snapshot)
    return None if raw is None else decode_layout(key, raw)


def write_layout(tr: KVTransaction, keys: KeySpace, cluster: str, layout: Layout) -> None:
    tr.set(keys.layout_key(cluster), encode_layout(layout))


def check_shards(shards: object) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigurationError(f"shards must be a whole number of at least 1, not {shards!r}")
    return shards


def open_layout(
    tr: KVTransaction,
    keys: KeySpace,
    cluster: str,
    requested: int | None,
    *,
    store: bool,
    new_cluster: bool = False,
) -> Layout:
    """The layout an opening client uses, in ``tr``: the stored one (refused with
    :class:`LayoutMismatch` if ``requested`` differs; an assumed one is replaced).

    With none stored: refused with :class:`UnknownCluster` when the store has other
    clusters, unless ``new_cluster``; else ``requested``, or 1 shard assumed (what every
    release before stored layouts assumed), written when ``store``. Before a first
    layout is written, every pointer in the cluster is checked to be where it says
    (:class:`UnrecordedShards`): a store used by an earlier release records its shard
    count nowhere else.
    """
    stored = read_layout(tr, keys, cluster)
    if stored is not None and not stored.assumed:
        if requested is not None and not stored.accepts(requested):
            raise LayoutMismatch(cluster, stored, requested)
        return stored
    if stored is None and not new_cluster:
        known = stored_clusters(tr, keys)
        if known and cluster not in known:  # (its keys without a layout: an old store)
            raise UnknownCluster(cluster, known)
    if stored is not None and requested is None:
        return stored  # assumed, and still nobody asked for a count
    layout = Layout(requested or 1, assumed=requested is None)
    if stored is not None:  # an assumed layout, replaced by the count asked for
        layout = Layout(layout.shards, stored.epoch + (stored.shards != layout.shards))
    misplaced = find_misplaced(tr, keys, cluster, layout.shards)
    if misplaced is not None:
        raise UnrecordedShards(cluster, layout.shards, *misplaced)
    if store:
        write_layout(tr, keys, cluster, layout)
    return layout


def stored_clusters(tr: KVTransaction, keys: KeySpace, *, most: int = 1000) -> list[str]:
    """The clusters of a store, sorted: those with a stored layout (a read that conflicts
    with another cluster's first layout, so two first opens of different clusters cannot
    both pass), and those with keys but none (a store from before layouts)."""
    names = set()
    begin, end = keys.meta_range("layout")
    for key, _ in tr.get_range(begin, end, limit=most):
        names.add(str(keys.unpack(key)[2]))
    begin, end = tuple_range(fdbtuple.pack((keys.root, "c")))
    for _ in range(most):
        rows = tr.get_range(begin, end, limit=1, snapshot=True)
        if not rows:
            break
        name = str(keys.unpack(rows[0][0])[1])
        names.add(name)
        begin = strinc(keys.cluster_prefix(name))
    return sorted(names)


def find_misplaced(
    tr: KVTransaction, keys: KeySpace, cluster: str, shards: int
) -> tuple[int, ZoneId | None] | None:
    """A (shard, zone) of ``cluster`` whose pointer ``shards`` would not put where it is
    (zone None: some key in a shard beyond them), or None; snapshot reads."""
    beyond = keys.shard_prefix(cluster, shards)
    rows = tr.get_range(beyond, strinc(keys.cluster_prefix(cluster)), limit=1, snapshot=True)
    if rows:
        return int(str(keys.unpack(rows[0][0])[2])), None
    if shards == 1:
        return None
    for shard in range(shards):
        begin, end = keys.pointer_index_range(cluster, shard)
        for key, _ in tr.get_range(begin, end, snapshot=True):
            zone = keys.unpack_pointer_index_key(cluster, shard, key)
            if shard_for(zone, shards) != shard:
                return shard, zone
    return None
