"""The layout of a top-level queue, stored with the queue: how many shards decide where a
zone's pointer lives.

    (root, "m", "layout", cluster) -> {"v": 1, "s": shards, "e": epoch, "t": target}

Every process on one store must agree on it: a producer that puts a zone's pointer in
shard 3 of 4 and a consumer that polls only shard 0 of 1 would leave the zone's items
unrun forever. So the first open stores it, an open that asks for another is refused
(:class:`LayoutMismatch`), and an open that asks for nothing uses it.

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
from quickzones.store.keys import LOCAL_APP, KeySpace, shard_of
from quickzones.store.kv import KVTransaction, strinc
from quickzones.store.records import ZoneId

LAYOUT_VERSION = 1


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a cluster's pointers live: ``shards``, and during a reshard ``target``."""

    shards: int
    epoch: int = 0
    target: int | None = None  # set while a reshard moves pointers to this count

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
    packed: bytes = msgpack.packb(obj)
    return packed


def decode_layout(key: bytes, raw: bytes) -> Layout:
    try:
        obj = msgpack.unpackb(raw)
        target = obj.get("t")
        layout = Layout(int(obj["s"]), int(obj["e"]), None if target is None else int(target))
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
    tr: KVTransaction, keys: KeySpace, cluster: str, requested: int | None, *, store: bool
) -> Layout:
    """The layout an opening client uses, in ``tr``: the stored one (refused with
    :class:`LayoutMismatch` if ``requested`` differs).

    With none stored: ``requested``, written when ``store``; an open that asks for nothing
    writes nothing and uses 1 shard, what every release before stored layouts assumed (a
    layout stored later is adopted by its next enqueue or scan). Before the first layout
    is written, every pointer in the cluster is checked to be where it says
    (:class:`UnrecordedShards`): a store used by an earlier release records its shard
    count nowhere else.
    """
    stored = read_layout(tr, keys, cluster)
    if stored is not None:
        if requested is not None and not stored.accepts(requested):
            raise LayoutMismatch(cluster, stored, requested)
        return stored
    layout = Layout(requested or 1)
    misplaced = find_misplaced(tr, keys, cluster, layout.shards)
    if misplaced is not None:
        raise UnrecordedShards(cluster, layout.shards, *misplaced)
    if store and requested is not None:
        write_layout(tr, keys, cluster, layout)
    return layout


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
