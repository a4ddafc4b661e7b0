"""The top-level queue (paper section 6): pointers to possibly non-empty zones.

A top-level queue belongs to a cluster and is split into shards by a stable hash of
(app, tenant). Per shard it keeps pointer records, a vesting index that scanners peek in
vesting order, and a pointer index (app, tenant) -> pointer_id that enqueues read instead of
the pointer record, so a consumer's pointer lease never aborts a user's enqueue
(invariant 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

from quickzones.clock import Clock, SystemClock, now_ms
from quickzones.errors import CorruptRecord, StorageError, ZoneLeaseFailed
from quickzones.store.ids import IdSource, random_ids
from quickzones.store.keys import LOCAL_APP, KeySpace
from quickzones.store.kv import (
    OWN_STORE,
    EarlierIfLater,
    KVError,
    KVStore,
    KVTransaction,
    _Uncommitted,
    attempt_once,
    create_if_absent,
    earlier_if_later,
    follows_own_commit,
    get_many,
    holds_commit_lock,
    relax_durability,
    run,
    strinc,
    transactional,
    wake_watchers,
)
from quickzones.store.layout import Layout, check_shards, decode_layout, open_layout
from quickzones.store.pages import merged_page
from quickzones.store.pointer_gc import collect_pointer_if_inactive
from quickzones.store.pointer_repair import set_aside
from quickzones.store.records import (
    Pointer,
    ZoneId,
    decode_pointer,
    encode_pointer,
    idle_pointer_head,
)
from quickzones.store.tuple_layer import fdbtuple


class Unread:
    """The type of :data:`UNREAD`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNREAD"


T = TypeVar("T")

UNREAD = Unread()
"""A value not read yet (``ensure_pointer(index=...)``); None means read and absent."""


# Zones whose pointer id a top-level queue remembers (a few hundred kB at most).
KNOWN_POINTERS = 4096
# How long after part two's own transaction pulled a zone's pointer the zone's enqueues
# still ask the store to pull it at their commit whatever it kept of the record.
PULLED_LATELY_S = 10.0
# Peeks of shard 0 per read of the layout that comes with one: a read of its own on stores
# that read one key at a time (PostgreSQL: a round trip of every scan, on each small
# tenant's pickup). A reshard's new shards are polled within this many scan rounds (an
# idle consumer's: about 0.2 s).
LAYOUT_READ_EVERY = 8


class IndexEntry(NamedTuple):
    """A zone's pointer index entry as part one found it: its shard and pointer id."""

    shard: int
    pointer_id: bytes


@dataclass(frozen=True, slots=True)
class PointerRef:
    """Where a pointer lives: its shard and id, as the scanner saw it."""

    shard: int
    pointer_id: str
    vesting_ms: int
    cluster: str = "default"


@dataclass(frozen=True, slots=True)
class GuardedPointer:
    """A pointer the store makes at commit where the zone has none
    (:meth:`TopLevelQueue.create_pointer_where_absent`): its shard and id, and the call
    that gives, once committed, the zone's index entry and the record it names as read
    just after the commit (None: not read)."""

    shard: int
    pointer_id: bytes
    values: Callable[[], tuple[bytes | None, bytes | None] | None]


LISTING_PAGE = 1000  # keys a listing's transaction reads at most (far inside the 5 s)
ZONES_REMEMBERED = 100_000  # pointers whose zone vested_zones keeps (then it starts over)


def lease_of(
    pointer: Pointer,
    ref: PointerRef,
    now: int,
    lease_ms: int,
    ids: IdSource,
    *,
    accept: Callable[[PointerRef, ZoneId], bool] | None,
    horizon_ms: int,
    holder: str | None,
) -> Pointer:
    """``pointer`` leased for ``lease_ms`` from ``now`` (paper Algorithm 1), or
    ZoneLeaseFailed: "moved" when it no longer vests (within ``horizon_ms``, and only
    where nobody's lease on it still runs), "not_routed" when ``accept`` refuses its zone.
    Every top-level queue's pointer lease decides here, whatever it reads and writes. The
    lease id is drawn from ``ids`` only once the lease is granted (a seeded source then
    replays the same ids)."""
    if pointer.vesting_ms > now and (
        pointer.vesting_ms > now + horizon_ms or pointer.lease_id is not None
    ):
        raise ZoneLeaseFailed("moved")
    if accept is not None and not accept(ref, pointer.zone):
        raise ZoneLeaseFailed("not_routed")
    return Pointer(
        pointer.pointer_id,
        pointer.zone,
        now + lease_ms,
        pointer.last_active_ms,
        lease_id=ids(16),
        local=pointer.local,
        holder=holder,
    )


class TopLevelQueue:
    """Pointers of one cluster, over a KV store.

    Where a zone's pointer lives is decided by the cluster's :class:`Layout`, stored in
    the store (:mod:`quickzones.store.layout`). ``shards`` is the layout used while none is
    stored; :meth:`open_layout` adopts the stored one. The layout held here is a cache:
    enqueues read the stored one in their own transaction, a scan round refreshes it, and
    a pointer not found where the cache says is looked for under the stored one.
    """

    # Whether its pointers can move between shards online (quickzones.store.reshard).
    reshards = True

    def __init__(
        self,
        kv: KVStore,
        *,
        keys: KeySpace | None = None,
        cluster: str = "default",
        shards: int = 1,
        clock: Clock | None = None,
        ids: IdSource | None = None,
    ) -> None:
        if shards < 1:
            raise ValueError("shards must be at least 1")
        self.kv = kv
        self.keys = keys or KeySpace()
        self.cluster = cluster
        self.layout_key = self.keys.layout_key(cluster)
        self._configured = Layout(shards)
        self.layout = self._configured
        self.clock = clock or SystemClock()
        # Pointer and pointer-lease ids; pointer ids order a scanner's peek, so a replayable
        # run passes a seeded source.
        self.ids = ids or random_ids
        self._peeks_since_layout = LAYOUT_READ_EVERY  # the first peek reads it
        # The pointer each zone's index entry named when this process last read or made
        # it: a transaction holding the commit lock reads that record with the index
        # entry, so part two (which then joins part one) needs no round trip of its own.
        self._known_pointers: dict[ZoneId, IndexEntry] = {}
        # When each zone's pointer last had to be pulled (a zone its visits empty), by part
        # two's own transaction or at an enqueue's commit: its enqueues ask the store to
        # pull at their commit even where what it kept of the record says there is
        # nothing to do (it may be stale: a consumer elsewhere requeued it since).
        self._pulled_lately: dict[ZoneId, float] = {}
        # The record each zone's last pull_at_commit asked the store to write.
        self._pull_sent: dict[ZoneId, bytes] = {}
        # pull_at_commit's parts of a known pointer: its idle record's head, its index,
        # record and vesting keys.
        self._pull_parts: dict[
            tuple[ZoneId, IndexEntry], tuple[bytes, bytes, bytes, tuple[bytes, bytes]]
        ] = {}
        # The last stored layout record decoded, and what it said: every enqueue reads the
        # record (with a conflict) and it almost never changes, so it is decoded once.
        self._decoded: tuple[bytes, Layout] | None = None
        # Each pointer's zone, once read by vested_zones: a pointer's zone never changes
        # (a zone that loses its pointer gets a new id), so a record is read once, not at
        # every scan. Cleared when it reaches ZONES_REMEMBERED.
        self._zones_of: dict[tuple[int, str], ZoneId] = {}

    @property
    def shards(self) -> int:
        """How many shards consumers poll: the layout's, and during a reshard the larger
        of the old and the target count."""
        return self.layout.polled

    def open_layout(
        self, requested: int | None, *, store: bool = True, new_cluster: bool = False
    ) -> Layout:
        """Adopt the stored layout (refusing a different ``requested`` one with
        :class:`~quickzones.store.layout.LayoutMismatch`), or store ``requested`` (default
        1) as the first; ``store=False`` writes nothing. See :func:`layout.open_layout`."""
        if requested is not None:
            check_shards(requested)
        self.layout = run(
            self.kv,
            lambda tr: open_layout(
                tr, self.keys, self.cluster, requested, store=store, new_cluster=new_cluster
            ),
        )
        self._configured = self.layout
        return self.layout

    @transactional
    def refresh_layout(self, *, tr: KVTransaction = OWN_STORE) -> Layout:
        """Read the stored layout again (a snapshot read) and use it from now on."""
        return self._layout_in(tr, snapshot=True)

    def _layout_in(self, tr: KVTransaction, *, snapshot: bool) -> Layout:
        return self._adopt(tr.get(self.layout_key, snapshot=snapshot))

    def _adopt(self, raw: bytes | None) -> Layout:
        """The layout a stored record says (the configured one if none), cached."""
        if raw is None:
            layout = self._configured
        elif self._decoded is not None and self._decoded[0] == raw:
            layout = self._decoded[1]
        else:
            layout = decode_layout(self.layout_key, raw)
            self._decoded = (raw, layout)
        if layout != self.layout:
            self.layout = layout
        return layout

    def shard_for(self, zone: ZoneId) -> int:
        """The shard where a new pointer of ``zone`` is made (the cached layout's)."""
        return self.layout.home(zone)

    def local_zone(self, shard: int = 0) -> ZoneId:
        """The zone of the local work items of one shard (cluster maintenance work)."""
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} out of range 0..{self.shards - 1}")
        return self.keys.local_zone(self.cluster, shard)

    # --- enqueue side ------------------------------------------------------------------

    def index_key(self, zone: ZoneId) -> bytes:
        """The key of ``zone``'s pointer index entry where the cached layout makes new
        pointers (what part one reads; a caller that reads it ahead passes it back to
        :meth:`ensure_pointer` as ``index_key``)."""
        return self.keys.pointer_index_key(self.cluster, self.shard_for(zone), zone)

    def index_keys(self, zone: ZoneId) -> list[bytes]:
        """Every key where ``zone``'s pointer index entry may be under the cached layout
        (two during a reshard): what a reader that must conflict with enqueues covers."""
        return [
            self.keys.pointer_index_key(self.cluster, shard, zone)
            for shard in self.layout.places(zone)
        ]

    def ensure_pointer(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        vesting_ms: int,
        *,
        declare_conflict: bool = False,
        index: bytes | Unread | None = UNREAD,
        index_key: bytes | None = None,
    ) -> IndexEntry | None:
        """Part one of the two-part enqueue, inside the caller's transaction.

        Reads the stored layout and the pointer index entry (never the pointer record)
        with conflicts: a reshard that changes the layout or moves this zone's pointer
        before the commit aborts the transaction, which retries under the new layout. If
        the entry is absent from every shard the layout allows, creates the pointer
        vesting at ``vesting_ms`` in its home shard. If present and ``declare_conflict``
        (external-store mode), declares a write conflict on the index key so a concurrent
        pointer deletion that read it aborts.

        Returns the index entry found when the pointer already existed (None: created
        now), so part two (:meth:`pull_pointer_earlier`) must run after the commit. Part
        one cannot decide that itself: whatever it read of the pointer record could be
        stale by its commit (a consumer may lease and requeue the pointer in between
        without seeing this item), and reading it with a conflict would let pointer leases
        abort user transactions; unless ``tr`` holds the store's commit lock, when part
        two runs inside it (:func:`~quickzones.store.enqueue.pointer_check`).

        ``index``, ``index_key``: the entry's value as the caller already read it in
        ``tr`` from ``index_key`` (default: :meth:`index_key`), so it is not read again.
        """
        home_shard = self.shard_for(zone)
        home_key = self.keys.pointer_index_key(self.cluster, home_shard, zone)
        if isinstance(index, Unread):
            # The layout and the likely index entry in one round trip where the store
            # reads in parallel; the cached layout is almost always the stored one.
            wanted = [self.layout_key, home_key]
            known = self._known_pointers.get(zone) if holds_commit_lock(tr) else None
            if known is not None:
                # Read now, it answers part two's read from the transaction's cache if the
                # entry still names it (nothing can commit meanwhile: no conflict to add).
                wanted.append(
                    self.keys.pointer_key(self.cluster, known.shard, known.pointer_id.decode())
                )
            raw_layout, index, *_ = get_many(tr, wanted)
            index_key = home_key
            layout = self._adopt(raw_layout)
        else:
            layout = self._layout_in(tr, snapshot=False)
        for shard in layout.places(zone):
            key = (
                home_key
                if shard == home_shard
                else self.keys.pointer_index_key(self.cluster, shard, zone)
            )
            found = index if key == (index_key or home_key) else tr.get(key)
            if found is not None:
                if declare_conflict:
                    tr.add_write_conflict_key(key)
                return self._knew(zone, IndexEntry(shard, found))
        pointer = self._new_pointer(zone, vesting_ms)
        home = layout.home(zone)
        self.write_pointer(tr, home, pointer)
        wake_watchers(tr)  # a new zone has work: consumers elsewhere hear of it at once
        tr.set(self.keys.pointer_index_key(self.cluster, home, zone), pointer.pointer_id.encode())
        self._knew(zone, IndexEntry(home, pointer.pointer_id.encode()))
        return None

    def create_pointer_where_absent(
        self, tr: KVTransaction, zone: ZoneId, vesting_ms: int
    ) -> GuardedPointer | None:
        """Part one's pointer check made by the store at ``tr``'s commit, where it can
        (:func:`~quickzones.store.kv.create_if_absent`, PostgreSQL): the pointer, vesting
        at ``vesting_ms``, and its index entry are written only if the zone has no entry
        then, and the commit fails (and its next try reads) unless the layout is still the
        one this process last read, as :meth:`ensure_pointer`'s conflicting read of both
        would. No read before the commit: an enqueue into a zone is one round trip. None
        where it cannot (no layout read yet, a reshard under way, a store or try without
        the capability): the caller runs :meth:`ensure_pointer`."""
        decoded = self._decoded
        if decoded is None or holds_commit_lock(tr):
            return None
        raw, layout = decoded
        if layout.moving:
            return None
        shard = layout.home(zone)
        keys, cluster = self.keys, self.cluster
        index_key = keys.pointer_index_key(cluster, shard, zone)
        made: list[str] = []

        def writes() -> list[tuple[bytes, bytes]]:
            pointer = self._new_pointer(zone, vesting_ms)
            pointer_id = pointer.pointer_id
            made.append(pointer_id)
            return [
                (keys.pointer_key(cluster, shard, pointer_id), encode_pointer(pointer)),
                (keys.pointer_vesting_key(cluster, shard, vesting_ms, pointer_id), b""),
                (index_key, pointer_id.encode()),
            ]

        values = create_if_absent(
            tr,
            index_key,
            writes,
            expect={self.layout_key: raw},
            follow=keys.pointer_key_around(cluster, shard),
            wake=True,  # a new zone has work: consumers elsewhere hear of it at once
        )
        if values is None:
            return None
        known = self._known_pointers.get(zone)
        if known is not None and known.shard == shard:
            self.pull_at_commit(tr, zone, vesting_ms, known)
        return GuardedPointer(shard, made[-1].encode(), values)

    def pull_at_commit(
        self, tr: KVTransaction, zone: ZoneId, vesting_ms: int, found: IndexEntry
    ) -> bool:
        """Part two made by the store in ``tr``'s commit where it can
        (:func:`~quickzones.store.kv.earlier_if_later`, PostgreSQL), with the checks of
        :meth:`pull_pointer_earlier`: only if ``found`` is still the zone's entry and its
        pointer idle and vesting later than ``vesting_ms``. The read after the commit
        tells whether it was made (:meth:`pulled_already`); False where the store cannot,
        and part two runs after the commit as before."""

        def earlier() -> EarlierIfLater | None:
            pointer_id = found.pointer_id.decode()
            pulled = Pointer(
                pointer_id=pointer_id,
                zone=zone,
                vesting_ms=vesting_ms,
                last_active_ms=now_ms(self.clock),
                local=zone.app == LOCAL_APP,
            )
            record = encode_pointer(pulled)
            # What does not change with the time, made once a pointer (every enqueue
            # into a busy zone asks, and the store most often sends nothing).
            parts = self._pull_parts.get((zone, found))
            if parts is None:
                head = idle_pointer_head(record, pulled)
                if head is None:
                    return None
                keys, cluster, shard = self.keys, self.cluster, found.shard
                parts = (
                    head,
                    keys.pointer_index_key(cluster, shard, zone),
                    keys.pointer_key(cluster, shard, pointer_id),
                    keys.pointer_vesting_around(cluster, shard, pointer_id),
                )
                if len(self._pull_parts) >= KNOWN_POINTERS:
                    self._pull_parts.clear()
                self._pull_parts[(zone, found)] = parts
            head, index_key, key, entry = parts
            if record[len(head) : len(head) + 1] != b"\xcf" or not record.startswith(head):
                return None  # not laid out so (a vesting time short of a uint64)
            keys = self.keys
            if len(self._pull_sent) >= KNOWN_POINTERS:
                self._pull_sent.clear()
            self._pull_sent[zone] = record
            return EarlierIfLater(
                index_key=index_key,
                index=found.pointer_id,
                key=key,
                head=head,
                limit=vesting_ms,
                record=record,
                entry=entry,
                new_entry=keys.pointer_vesting_key(
                    self.cluster, found.shard, vesting_ms, pointer_id
                ),
            )

        pulled = self._pulled_lately.get(zone)
        likely = pulled is not None and time.monotonic() - pulled < PULLED_LATELY_S
        return earlier_if_later(tr, earlier, likely=likely)

    def after_pull_at_commit(self, zone: ZoneId, record: bytes | None) -> None:
        """``zone``'s pointer record as read just after a commit that asked the store to
        pull it (:meth:`pull_at_commit`): where it is the record asked for, the store
        pulled it, and the zone's next enqueues ask again whatever the store kept."""
        sent = self._pull_sent.pop(zone, None)
        if sent is not None and record == sent:
            self._pulled(zone)

    def _pulled(self, zone: ZoneId) -> None:
        if len(self._pulled_lately) >= KNOWN_POINTERS:
            self._pulled_lately.clear()
        self._pulled_lately[zone] = time.monotonic()

    def _new_pointer(self, zone: ZoneId, vesting_ms: int) -> Pointer:
        """A new pointer of ``zone`` (part one's, where the zone has none), active now."""
        return Pointer(
            pointer_id=self.ids(8),
            zone=zone,
            vesting_ms=vesting_ms,
            last_active_ms=now_ms(self.clock),
            local=zone.app == LOCAL_APP,
        )

    def found_by_guard(self, zone: ZoneId, guarded: GuardedPointer, index: bytes) -> IndexEntry:
        """The entry a commit with ``guarded`` found in place of its own pointer."""
        return self._knew(zone, IndexEntry(guarded.shard, index))

    def _knew(self, zone: ZoneId, entry: IndexEntry) -> IndexEntry:
        """Remember ``entry`` as ``zone``'s (a hint, never trusted: see ensure_pointer)."""
        if len(self._known_pointers) >= KNOWN_POINTERS:
            self._known_pointers.clear()
        self._known_pointers[zone] = entry
        return entry

    def _find_index(
        self, tr: KVTransaction, zone: ZoneId, *, snapshot: bool
    ) -> tuple[int, bytes | None]:
        """(shard, pointer id) of ``zone``'s index entry under the cached layout, else
        under the stored one; (home shard, None) when it has none."""
        tried: set[int] = set()
        for layout in (self.layout, None):
            if layout is None:
                layout = self._layout_in(tr, snapshot=True)
            for shard in layout.places(zone):
                if shard in tried:
                    continue
                tried.add(shard)
                key = self.keys.pointer_index_key(self.cluster, shard, zone)
                found = tr.get(key, snapshot=snapshot)
                if found is not None:
                    return shard, found
        return self.layout.home(zone), None

    def _index_and_pointer(self, tr: KVTransaction, zone: ZoneId) -> tuple[int, Pointer | None]:
        """(shard, record read with a conflict) of ``zone``'s pointer; (home shard, None)
        when it has none. The index entry and the record of the pointer this process last
        saw for the zone are read together (one round trip where the store reads in
        parallel); the record is trusted only while the entry still names it."""
        known = self._known_pointers.get(zone)
        if known is not None:
            index_key = self.keys.pointer_index_key(self.cluster, known.shard, zone)
            pointer_id = known.pointer_id.decode()
            index, raw = get_many(
                tr, [index_key, self.keys.pointer_key(self.cluster, known.shard, pointer_id)]
            )
            if index == known.pointer_id:
                key = self.keys.pointer_key(self.cluster, known.shard, pointer_id)
                return known.shard, None if raw is None else decode_pointer(key, raw)
        shard, index = self._find_index(tr, zone, snapshot=True)
        if index is None:
            return shard, None
        self._knew(zone, IndexEntry(shard, index))
        return shard, self._read_pointer(tr, shard, index.decode())

    def after_commit_keys(self, zone: ZoneId, found: IndexEntry) -> list[bytes]:
        """The keys part two reads, as part one found them: the zone's index entry in
        ``found``'s shard and the pointer record it names (see :meth:`pulled_already`)."""
        return [
            self.keys.pointer_index_key(self.cluster, found.shard, zone),
            self.keys.pointer_key(self.cluster, found.shard, found.pointer_id.decode()),
        ]

    def pulled_already(
        self, found: IndexEntry, values: list[bytes | None], vesting_ms: int
    ) -> bool:
        """Whether part two would change nothing, from ``values`` of
        :meth:`after_commit_keys` read once part one's commit was in place: the index
        still names ``found``'s pointer and its record is leased (its holder requeues it
        reading the zone, so it sees the item) or vests no later than ``vesting_ms``. A
        read after the commit is what part two's own transaction would read; anything
        else (moved, missing, unreadable, vesting later) is left to part two."""
        index, raw = values
        if index != found.pointer_id or raw is None:
            return False
        key = self.keys.pointer_key(self.cluster, found.shard, found.pointer_id.decode())
        try:
            pointer = decode_pointer(key, raw)
        except CorruptRecord:
            return False
        return pointer.lease_id is not None or pointer.vesting_ms <= vesting_ms

    def pull_pointer_earlier(
        self,
        zone: ZoneId,
        vesting_ms: int,
        *,
        tr: KVTransaction | None = None,
        found: IndexEntry | None = None,
        active_ms: int | None = None,
        after_own_commit: Mapping[bytes, bytes | None] | None = None,
    ) -> None:
        """Part two: in its own transaction, move an idle pointer's vesting earlier.

        Best effort: never raises to the enqueuer. A leased pointer is left alone; its
        holder requeues it at the zone's minimum vesting time in a transaction that reads
        the zone, so it sees this item or conflicts with its enqueue.

        ``tr``: run inside it instead, errors raised (part one's transaction where it
        holds the store's commit lock, see :func:`~quickzones.store.kv.holds_commit_lock`),
        with ``found``, the index entry part one read there. ``active_ms``: when the zone
        was last active (the enqueue's time), for a ``tr`` that holds the store's write
        lock, where the clock must not be read: a steady clock's exchange with the store
        would wait for that lock (default: the clock's now). ``after_own_commit``: what
        part one's commit read of part two's keys after its COMMIT, which may answer its
        own transaction's first read (:func:`~quickzones.store.kv.follows_own_commit`: no
        read of its own on PostgreSQL).
        """

        def pull(tr: KVTransaction) -> None:
            if found is not None:
                shard = found.shard
                pointer = self._read_pointer(tr, shard, found.pointer_id.decode())
            else:
                shard, pointer = self._index_and_pointer(tr, zone)
            if pointer is None or pointer.lease_id is not None:
                return
            if pointer.vesting_ms > vesting_ms:
                self._pulled(zone)
                # This enqueue saw an item in the zone: it is active now.
                active = now_ms(self.clock) if active_ms is None else active_ms
                earlier = replace(pointer, vesting_ms=vesting_ms, last_active_ms=active)
                self._move_pointer(tr, shard, pointer, earlier)
                wake_watchers(tr)

        if tr is not None:
            pull(tr)
            return

        def own(tr: KVTransaction) -> None:
            # Best effort as it is, it need not wait for the server's log flush: a crash
            # of the server that undoes it leaves the pointer vesting later, as a
            # producer killed before part two does (kv.relax_durability).
            relax_durability(tr)
            if after_own_commit is not None:
                follows_own_commit(tr, after_own_commit)
            pull(tr)

        try:
            run(self.kv, own)
        except StorageError:  # also bounded-retry failures: StoreBusy, RetryLimitExceeded
            pass  # the pointer vests later anyway; the item is not lost

    # --- consumer side -----------------------------------------------------------------

    def peek_pointers(self, shard: int, max_pointers: int) -> list[PointerRef]:
        """Vested pointers of one shard in vesting order: a snapshot read, no conflicts."""
        return self.peek(shard, max_pointers)[0]

    def peek(
        self,
        shard: int,
        max_pointers: int,
        *,
        horizon_ms: int = 0,
        start: PointerRef | None = None,
        ahead_ms: int | None = None,
    ) -> tuple[list[PointerRef], int | None]:
        """Vested pointers of one shard in vesting order, and the vesting time of the
        first one not yet vested when fewer than ``max_pointers`` are (else None): one
        snapshot range read, no conflicts. A consumer sleeps until that time. With
        ``horizon_ms``, "vested" means vesting within that many ms (a consumer's timer
        lookahead). ``start``: from that pointer's place in the order on (itself, if it is
        still there), not from the oldest (a random-mode scan's slice,
        :mod:`~quickzones.consumer.random_slices`). ``ahead_ms``: that first one is looked
        for no further than this past the horizon (a consumer's longest sleep: it scans
        again by then anyway), and one vesting later is not told (None), as where none
        does: PostgreSQL keeps every version of a pointer beside a long snapshot, and a
        read to the tenth pointer ahead walked each one's old versions up to 30 s ahead
        (:meth:`~quickzones.store.sql.toplevel.SQLTopLevelQueue.peek`)."""
        now = now_ms(self.clock) + horizon_ms
        begin, vested_end = self.keys.pointer_vested_range(self.cluster, shard, now)
        if start is not None:
            vesting, pointer_id = start.vesting_ms, start.pointer_id
            at = self.keys.pointer_vesting_key(self.cluster, shard, vesting, pointer_id)
            begin = max(begin, at)
        end = strinc(self.keys.pointer_vesting_prefix(self.cluster, shard))
        if ahead_ms is not None:
            end = min(end, self.keys.pointer_vested_range(self.cluster, shard, now + ahead_ms)[1])

        def peek(tr: KVTransaction) -> tuple[list[PointerRef], int | None]:
            tr.set_causal_read_risky()
            if shard == 0:
                # Every scan round peeks shard 0: every few bring the layout up to date,
                # so a consumer polls a reshard's new shards soon after it starts.
                self._peeks_since_layout += 1
                if self._peeks_since_layout >= LAYOUT_READ_EVERY:
                    self._layout_in(tr, snapshot=True)
                    self._peeks_since_layout = 0
            rows = tr.get_range(begin, end, limit=max_pointers + 1, snapshot=True)
            out: list[PointerRef] = []
            for key, _ in rows:
                vesting, pointer_id = self.keys.unpack_pointer_vesting_key(self.cluster, shard, key)
                if key >= vested_end:
                    return out, vesting
                if len(out) == max_pointers:
                    break
                out.append(PointerRef(shard, pointer_id, vesting, self.cluster))
            return out, None

        return run(self.kv, peek)

    def vested_zones(
        self, shard: int, window: int, *, after: PointerRef | None = None
    ) -> list[tuple[PointerRef, ZoneId]]:
        """Up to ``window`` vested pointers of one shard in vesting order, each with its
        zone, from the oldest or from just after ``after``: snapshot reads, no conflicts
        (a server's peek for one app's pull lease pages through them). A pointer whose
        record cannot be decoded is set aside (:func:`~quickzones.store.pointer_repair.set_aside`:
        its bytes kept, a new pointer made for its zone, vesting now, as a consumer's
        pointer lease does) and left out; so are pointers gone since the range read."""
        begin, end = self.keys.pointer_vested_range(self.cluster, shard, now_ms(self.clock))
        if after is not None:
            at = self.keys.pointer_vesting_key(
                self.cluster, shard, after.vesting_ms, after.pointer_id
            )
            begin = max(begin, at + b"\x00")
        spoilt: list[tuple[PointerRef, str]] = []

        def page(tr: KVTransaction) -> list[tuple[PointerRef, ZoneId]]:
            tr.set_causal_read_risky()
            spoilt.clear()
            found = []
            for key, _ in tr.get_range(begin, end, limit=window, snapshot=True):
                vesting, pointer_id = self.keys.unpack_pointer_vesting_key(self.cluster, shard, key)
                ref = PointerRef(shard, pointer_id, vesting, self.cluster)
                zone = self._zones_of.get((shard, pointer_id))
                if zone is None:
                    pkey = self.keys.pointer_key(self.cluster, shard, pointer_id)
                    raw = tr.get(pkey, snapshot=True)
                    if raw is None:
                        continue
                    try:
                        zone = decode_pointer(pkey, raw).zone
                    except CorruptRecord as err:
                        spoilt.append((ref, err.reason))
                        continue
                    if len(self._zones_of) >= ZONES_REMEMBERED:
                        self._zones_of.clear()
                    self._zones_of[(shard, pointer_id)] = zone
                found.append((ref, zone))
            return found

        rows = run(self.kv, page)
        for ref, reason in spoilt:
            set_aside(self, ref, reason)
        return rows

    def drop_pointer_if_empty(
        self, zone: ZoneId, zone_is_empty: Callable[[KVTransaction], bool]
    ) -> bool:
        """Delete ``zone``'s pointer in a transaction that reads the pointer index key and
        observes the zone empty (invariant 2): a tenant move's source zone, emptied by the
        move rather than by consumers. True if the zone has no pointer afterwards."""

        def drop(tr: KVTransaction) -> bool:
            # Every place the layout allows (two during a reshard), each read with a conflict.
            for shard in self.layout.places(zone):
                index_key = self.keys.pointer_index_key(self.cluster, shard, zone)
                index = tr.get(index_key)
                if index is None:
                    continue
                if not zone_is_empty(tr):
                    return False
                pointer_key = self.keys.pointer_key(self.cluster, shard, index.decode())
                raw = tr.get(pointer_key)
                if raw is not None:
                    try:
                        pointer = decode_pointer(pointer_key, raw)
                        tr.clear(
                            self.keys.pointer_vesting_key(
                                self.cluster, shard, pointer.vesting_ms, pointer.pointer_id
                            )
                        )
                    except CorruptRecord:
                        pass  # the record goes; a stray vesting entry is skipped by scanners
                    tr.clear(pointer_key)
                tr.clear(index_key)
            return True

        return run(self.kv, drop)

    # --- listings (the HTTP pages) --------------------------------------------------------

    def _app_index_range(self, shard: int, app: str) -> tuple[bytes, bytes]:
        # (root, "c", cluster, shard, "ix", app, tenant) -> pointer_id
        prefix = self.keys.shard_prefix(self.cluster, shard) + fdbtuple.pack(("ix", app))
        return prefix + b"\x00", prefix + b"\xff"

    def apps(self) -> set[str]:
        """Apps with at least one zone that has a pointer: one short read per app and shard
        (each skips over the app's tenants), so many zones cost no more than few."""
        apps: set[str] = set()
        for shard in range(self.shards):
            begin, end = self.keys.pointer_index_range(self.cluster, shard)
            while True:

                def first(
                    tr: KVTransaction, start: bytes = begin, stop: bytes = end
                ) -> list[tuple[bytes, bytes]]:
                    return tr.get_range(start, stop, limit=1, snapshot=True)

                rows = run(self.kv, first)
                if not rows:
                    break
                app = str(self.keys.unpack(rows[0][0])[-2])
                apps.add(app)
                begin = self._app_index_range(shard, app)[1]
        return apps

    def zone_page(
        self,
        app: str,
        limit: int,
        *,
        after: bytes | None = None,
        contains: str | None = None,
        prefix: str | None = None,
        skip: int = 1000,
    ) -> tuple[list[str], bytes | None]:
        """One page of the tenants of ``app``'s zones that have a pointer, in name order
        from just after the opaque ``after``, and the next page's ``after`` (None: the
        last page), from each shard's index of the app's zones: at most ``limit + 1``
        keys a shard, or with ``contains`` (a substring, not a key prefix) at most
        ``skip`` more, after which the page ends short at the last tenant every shard has
        read past. ``prefix`` reads only the tenants whose name starts with it."""
        ranges = []
        for shard in range(self.shards):
            begin, end = self._app_index_range(shard, app)
            base = begin[:-1]
            if prefix is not None:
                # A packed string is 0x02, its UTF-8 bytes, 0x00 (a NUL doubled): the keys
                # of the names that start with ``prefix`` share these bytes.
                head = base + b"\x02" + prefix.encode("utf-8").replace(b"\x00", b"\x00\xff")
                begin, end = head, head + b"\xff"
            ranges.append((base, begin, end))

        def match(tr: KVTransaction, key: bytes, value: bytes) -> str | None:
            tenant = str(self.keys.unpack(key)[-1])
            return tenant if contains is None or contains in tenant else None

        return merged_page(self.kv, ranges, limit=limit, after=after, match=match, skip=skip)

    def zone_count(self, app: str, max_keys: int) -> tuple[int, bool]:
        """How many of ``app``'s zones have a pointer, and whether that is all of them:
        each shard's index of the app's zones read up to ``max_keys`` keys in all (then
        ``max_keys``, not exact)."""
        count = 0
        for shard in range(self.shards):
            left = max_keys - count
            begin, end = self._app_index_range(shard, app)
            read = 0
            while read <= left:
                want = min(LISTING_PAGE, left + 1 - read)

                def page(
                    tr: KVTransaction, start: bytes = begin, stop: bytes = end, n: int = want
                ) -> list[tuple[bytes, bytes]]:
                    return tr.get_range(start, stop, limit=n, snapshot=True)

                rows = run(self.kv, page)
                read += len(rows)
                if len(rows) < want:
                    break
                begin = rows[-1][0] + b"\x00"
            if read > left:
                return max_keys, False
            count += read
        return count, True

    def vested_zone_page(
        self, app: str, now_ms: int, limit: int, *, after: bytes | None = None, skip: int = 500
    ) -> tuple[list[str], bytes | None]:
        """One page of ``app``'s tenants whose pointers vested by ``now_ms``, in vesting
        order over every shard (the fairness page's "waiting longest"), from just after
        the opaque ``after``, and the next page's ``after`` (None: the last page).
        Snapshot reads; pointers of other apps, of the cluster's local work, gone or
        unreadable are passed over, at most ``skip`` keys a shard before the page ends
        short (:func:`~quickzones.store.pages.merged_page`)."""
        ranges = []
        for shard in range(self.shards):
            begin, end = self.keys.pointer_vested_range(self.cluster, shard, now_ms)
            ranges.append((self.keys.pointer_vesting_prefix(self.cluster, shard), begin, end))

        def match(tr: KVTransaction, key: bytes, value: bytes) -> str | None:
            # (root, "c", cluster, shard, "v", vesting, pointer_id)
            shard = self.keys.unpack(key)[2]
            assert isinstance(shard, int)
            pointer_id = self.keys.unpack_pointer_vesting_key(self.cluster, shard, key)[1]
            raw = tr.get(self.keys.pointer_key(self.cluster, shard, pointer_id), snapshot=True)
            if raw is None:
                return None
            try:
                pointer = decode_pointer(key, raw)
            except CorruptRecord:
                return None
            if pointer.local or pointer.zone.app != app:
                return None
            return pointer.zone.tenant

        return merged_page(self.kv, ranges, limit=limit, after=after, match=match, skip=skip)

    def zone_read(self, pointer: tuple[str, int, str]) -> ZoneId | None:
        """The zone of ``pointer`` (cluster, shard, pointer id) where :meth:`vested_zones`
        read it, else None (this store's own cluster's pointers only)."""
        cluster, shard, pointer_id = pointer
        return self._zones_of.get((shard, pointer_id)) if cluster == self.cluster else None

    def run_visit(self, visit: Callable[[KVTransaction], T]) -> T | _Uncommitted:
        """Run a one-transaction visit (``visit(tr)``: the pointers' leases, the zones'
        dequeues, the requeues) in one transaction of this queue's store and commit it,
        with no retry (:func:`~quickzones.store.kv.attempt_once`): UNCOMMITTED when it
        failed retryably, so the caller visits the paper's three transactions instead."""
        return attempt_once(self.kv, visit)

    def obtain_pointer_lease(
        self,
        ref: PointerRef,
        lease_ms: int,
        *,
        accept: Callable[[PointerRef, ZoneId], bool] | None = None,
        horizon_ms: int = 0,
        holder: str | None = None,
    ) -> Pointer:
        """Lease a pointer for ``lease_ms`` by moving its vesting time (paper Alg. 1), in a
        transaction of its own. ``horizon_ms``, ``holder``: as :meth:`lease_pointer`.

        Reads the pointer record, not the pointer index, so it never conflicts with an
        enqueue. Raises ZoneLeaseFailed with reason "moved" if the pointer is gone or no
        longer vested, "conflict" if another consumer leased it concurrently, and
        "not_routed" (nothing written) if ``accept`` refuses the pointer's zone.
        """
        tr = self.kv.create_transaction()
        try:
            tr.set_causal_read_risky()
            stored, leased = self.lease_pointer(
                ref, lease_ms, accept=accept, horizon_ms=horizon_ms, holder=holder, tr=tr
            )
            self._move_pointer(tr, ref.shard, stored, leased)
            tr.commit()
            return leased
        except KVError as err:
            if err.code == 1020:
                raise ZoneLeaseFailed("conflict") from err
            raise ZoneLeaseFailed(err.name) from err

    def lease_pointer(
        self,
        ref: PointerRef,
        lease_ms: int,
        *,
        accept: Callable[[PointerRef, ZoneId], bool] | None = None,
        horizon_ms: int = 0,
        holder: str | None = None,
        tr: KVTransaction,
    ) -> tuple[Pointer, Pointer]:
        """The pointer lease's reads and checks inside ``tr``: (the pointer as stored,
        leased); raises ZoneLeaseFailed "gone", "moved" or "not_routed". With
        ``horizon_ms`` a pointer vesting within that many ms is leased too, unless another
        consumer's lease on it still runs. ``holder``: the leasing consumer's name, kept
        in the record (``quick explain`` names it).

        It writes nothing: :meth:`obtain_pointer_lease` writes the lease; a visit that
        requeues the pointer in the same transaction (:meth:`requeue_pointer` with
        ``stored``) writes the pointer once, as nothing outside ``tr`` can see the lease
        (a one-item zone's visit wrote its record twice and its vesting index three
        times)."""
        try:
            pointer = self._read_pointer(tr, ref.shard, ref.pointer_id)
        except CorruptRecord as err:
            # Every visit would fail here and the zone would starve: set the record aside
            # and rebuild it (its own commit), and lease the rebuilt pointer next round.
            set_aside(self, ref, err.reason)
            raise ZoneLeaseFailed("corrupt") from err
        now = now_ms(self.clock)
        if pointer is None:
            set_aside(self, ref, "")  # clears the vesting entry if it names no record
            raise ZoneLeaseFailed("gone")
        leased = lease_of(
            pointer, ref, now, lease_ms, self.ids, accept=accept, horizon_ms=horizon_ms,
            holder=holder,
        )  # fmt: skip
        return pointer, leased

    @transactional
    def requeue_pointer(
        self,
        pointer: Pointer,
        zone_min_vesting: Callable[[KVTransaction], int | None],
        zone_is_empty: Callable[[KVTransaction], bool],
        *,
        min_inactive_ms: int,
        active: bool,
        stored: tuple[int, Pointer] | None = None,
        tr: KVTransaction = OWN_STORE,
        vests: Callable[[int], None] | None = None,
    ) -> str:
        """Release a leased pointer (paper Alg. 2, end of a Manager's visit).

        ``stored``: (shard, the pointer as stored) when ``pointer`` was leased in this
        same transaction by :meth:`lease_pointer`: the requeue moves the stored
        pointer, read by the lease, without reading it again.

        In one transaction that reads the zone: requeue the pointer at the zone's minimum
        vesting time; or, when the zone has been empty for ``min_inactive_ms``, delete it,
        reading the pointer index key so a concurrent enqueue's pointer check conflicts
        (invariant 2). Returns "requeued", "deleted", or "lost" (lease taken by another);
        ``vests`` is told the vesting time a requeued pointer gets (in each try of ``tr``).

        The pointer's last active time becomes now when the visit saw items in the zone:
        ``active`` (it dequeued some) or a minimum vesting time (items are there, vested,
        delayed or leased). So a zone is collected only ``min_inactive_ms`` after the last
        visit or enqueue that saw an item in it.
        """
        located = stored or self._locate(tr, pointer)  # stored: leased in tr, unwritten
        shard, current = located
        if current is None or (stored is None and current.lease_id != pointer.lease_id):
            return "lost"
        now = now_ms(self.clock)
        min_vesting = zone_min_vesting(tr)
        # Last active: the last time a visit saw items in the zone (the paper's measure for
        # collection): it took some, or some are there (delayed, or leased by workers
        # still running them), not only when this visit dequeued.
        seen = active or min_vesting is not None
        last_active = now if seen else current.last_active_ms
        if min_vesting is None:
            if collect_pointer_if_inactive(
                tr,
                self,
                shard,
                current,
                last_active_ms=last_active,
                min_inactive_ms=min_inactive_ms,
                zone_is_empty=zone_is_empty,
                now=now,
            ):
                return "deleted"
            vesting = last_active + min_inactive_ms
        else:
            # Never before now: a busy zone whose oldest item waits behind newer,
            # higher-priority work would otherwise sort first forever and keep the
            # in-order scanner from every other zone (invariant 10).
            vesting = max(min_vesting, now)
        updated = Pointer(
            current.pointer_id, current.zone, vesting, last_active, None, current.local
        )
        self._move_pointer(tr, shard, current, updated)
        if vests is not None:
            vests(vesting)
        return "requeued"

    def extend_pointer_lease(self, pointer: Pointer, lease_ms: int) -> Pointer | None:
        """Keep a pointer leased while its visit runs long; None if the lease was lost."""

        def extend(tr: KVTransaction) -> Pointer | None:
            shard, current = self._locate(tr, pointer)
            if current is None or current.lease_id != pointer.lease_id:
                return None
            updated = current.with_vesting(now_ms(self.clock) + lease_ms)
            self._move_pointer(tr, shard, current, updated)
            return updated

        return run(self.kv, extend)

    @transactional
    def get_pointer(self, zone: ZoneId, *, tr: KVTransaction = OWN_STORE) -> Pointer | None:
        """The zone's pointer, or None (snapshot reads: no conflict)."""
        shard, index = self._find_index(tr, zone, snapshot=True)
        if index is None:
            return None
        return self._read_pointer(tr, shard, index.decode(), snapshot=True)

    def list_pointers(self, shard: int, limit: int = 0) -> list[Pointer]:
        begin, end = self.keys.pointers_range(self.cluster, shard)

        def scan(tr: KVTransaction) -> list[Pointer]:
            out = []
            for k, v in tr.get_range(begin, end, limit=limit, snapshot=True):
                try:
                    out.append(decode_pointer(k, v))
                except CorruptRecord:
                    continue  # set aside when a consumer meets it (pointer_repair)
            return out

        return run(self.kv, scan)

    def count_pointers(self, shard: int) -> int:
        begin, end = self.keys.pointers_range(self.cluster, shard)
        return len(run(self.kv, lambda tr: tr.get_range(begin, end, snapshot=True)))

    # --- resharding (quickzones.store.reshard) -----------------------------------------

    @transactional
    def move_pointer(
        self, zone: ZoneId, src: int, dst: int, *, tr: KVTransaction = OWN_STORE
    ) -> int:
        """Move ``zone``'s pointer (record, vesting entry, index entry, lease) from shard
        ``src`` to ``dst``; 1 if it moved, 0 if it had gone. Reads both index entries and
        the record with conflicts, so a racing enqueue, lease, requeue or collection
        commits first and is moved with it, or conflicts and retries. A record that cannot
        be decoded is rebuilt vesting now: the zone is known from its index key."""
        keys, cluster = self.keys, self.cluster
        src_index = keys.pointer_index_key(cluster, src, zone)
        pointer_id = tr.get(src_index)
        if pointer_id is None:
            return 0  # collected since the caller looked
        pointer = self._read_or_rebuild(tr, src, pointer_id.decode(), zone)
        tr.clear(src_index)
        tr.clear(keys.pointer_key(cluster, src, pointer.pointer_id))
        tr.clear(keys.pointer_vesting_key(cluster, src, pointer.vesting_ms, pointer.pointer_id))
        dst_index = keys.pointer_index_key(cluster, dst, zone)
        existing = tr.get(dst_index)
        kept = None
        if existing is not None:
            kept = self._read_or_rebuild(tr, dst, existing.decode(), zone)
        if kept is None:
            tr.set(dst_index, pointer.pointer_id.encode())
            self.write_pointer(tr, dst, pointer)
        elif kept.lease_id is None and pointer.vesting_ms < kept.vesting_ms:
            # Two pointers for one zone cannot arise (an enqueue during a reshard looks in
            # both places); if they did, the one at home stays, vesting no later than either.
            self._move_pointer(tr, dst, kept, kept.with_vesting(pointer.vesting_ms))
        return 1

    # --- records -----------------------------------------------------------------------

    def _locate(self, tr: KVTransaction, pointer: Pointer) -> tuple[int, Pointer | None]:
        """(shard, record) of ``pointer`` as stored now, read with a conflict: where the
        cached layout puts its zone, else where the stored one does (a reshard may have
        moved it while it was leased)."""
        tried: set[int] = set()
        for layout in (self.layout, None):
            if layout is None:
                layout = self._layout_in(tr, snapshot=True)
            for shard in layout.places(pointer.zone):
                if shard in tried:
                    continue
                tried.add(shard)
                current = self._read_pointer(tr, shard, pointer.pointer_id)
                if current is not None:
                    return shard, current
        return self.layout.home(pointer.zone), None

    def lease_reads(self, ref: PointerRef) -> list[bytes]:
        """The keys :meth:`lease_pointer` reads for ``ref`` (for a read ahead)."""
        return [self.keys.pointer_key(self.cluster, ref.shard, ref.pointer_id)]

    def _read_pointer(
        self, tr: KVTransaction, shard: int, pointer_id: str, *, snapshot: bool = False
    ) -> Pointer | None:
        key = self.keys.pointer_key(self.cluster, shard, pointer_id)
        raw = tr.get(key, snapshot=snapshot)
        return None if raw is None else decode_pointer(key, raw)

    def _read_or_rebuild(
        self, tr: KVTransaction, shard: int, pointer_id: str, zone: ZoneId
    ) -> Pointer:
        """The record of ``zone``'s pointer ``pointer_id`` (read with a conflict); one
        vesting now in its place if it is missing or cannot be decoded (its zone is
        known from the index key that named it)."""
        try:
            found = self._read_pointer(tr, shard, pointer_id)
        except CorruptRecord:
            found = None
        if found is not None:
            return found
        now = now_ms(self.clock)
        return Pointer(pointer_id, zone, now, now, local=zone.app == LOCAL_APP)

    def write_pointer(self, tr: KVTransaction, shard: int, pointer: Pointer) -> None:
        """Write ``pointer``'s record and vesting entry in ``shard`` (not its index entry)."""
        tr.set(
            self.keys.pointer_key(self.cluster, shard, pointer.pointer_id), encode_pointer(pointer)
        )
        tr.set(
            self.keys.pointer_vesting_key(
                self.cluster, shard, pointer.vesting_ms, pointer.pointer_id
            ),
            b"",
        )

    def _move_pointer(self, tr: KVTransaction, shard: int, old: Pointer, new: Pointer) -> None:
        if old.vesting_ms != new.vesting_ms:
            tr.clear(
                self.keys.pointer_vesting_key(self.cluster, shard, old.vesting_ms, old.pointer_id)
            )
        self.write_pointer(tr, shard, new)
