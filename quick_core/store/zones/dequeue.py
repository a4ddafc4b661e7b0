"""Dequeue (the store's half of Algorithm 2's visit): peek and lease up to a batch of vested
items in one transaction, sending expired and corrupt items to dead letters so neither can
block the zone (invariant 8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quickzones.clock import now_ms
from quickzones.errors import (
    CorruptRecord,
)
from quickzones.store.kv import (
    OWN_STORE,
    KVTransaction,
    get_many,
    pack_i64,
    prefetch_range,
    transactional,
)
from quickzones.store.records import (
    WorkItem,
    ZoneId,
)
from quickzones.store.zones.budget import TransactionBudget
from quickzones.store.zones.dead_letters import ZoneDeadLetters
from quickzones.store.zones.items import check_lease_duration
from quickzones.store.zones.leases import ZoneLeases
from quickzones.store.zones.reads import ZoneReads
from quickzones.store.zonestore import CorruptItem

# A dequeue reads a zone of at most this many keys (entries, records, count) in one
# storage read first, where the store can answer later reads from it (kv.prefetch_range):
# a zone with a few items, the common visit, costs one storage read instead of about eight.
ZONE_PREFETCH_KEYS = 32
# After a zone held more than ZONE_PREFETCH_KEYS keys (a backlog), its next this many
# dequeues skip the prefetch, whose read would be thrown away: one storage read a visit
# less while a busy tenant drains, and a zone that has shrunk is prefetched again soon.
PREFETCH_SKIPS = 16
# Zones remembered as too big to prefetch (a dict entry each); past it the memory starts over.
PREFETCH_SKIPS_MAX = 4096
# Item records a dequeue reads at once (one round trip) before its budget has charged
# anything; then about as many as the budget has room for at the average cost so far, so
# a zone of small items is still read in one or two round trips, and a zone of large
# payloads not much past its budget (about 1 MB).
FIRST_READ = 64


@dataclass(slots=True)
class Left:
    """What a dequeue saw left in its zone (filled by each try of it): ``vested_ms``, the
    vesting time of a vested item it read and did not take, None when it saw none. The
    pointer's requeue in the same visit then vests the pointer now without reading the
    zone's order index again (a zone with a vested item has its next vesting time now).
    ``next_known``: the dequeue could tell, from what it read, the zone's next vesting
    time once its leases are written (``next_ms``, None where the zone is then empty), so
    that the requeue reads nothing either (the native SQL zones' one-statement read).
    ``taking``, where the visit set it: told how many items the dequeue leases once it
    decided, before it writes them (a store whose writes wait on the server: the native
    SQL zones), so the consumer frees the room it kept for more at once."""

    vested_ms: int | None = None
    next_ms: int | None = None
    next_known: bool = False
    taking: Callable[[int], None] | None = None

    def earliest(self, read: Callable[[], int | None]) -> int | None:
        """The zone's next vesting time after the dequeue: what it saw, else ``read()``."""
        if self.vested_ms is not None:
            return self.vested_ms
        if self.next_known:
            return self.next_ms
        return read()


class ZoneDequeue(ZoneLeases, ZoneReads, ZoneDeadLetters):
    # Per zone too big to prefetch lately: how many more dequeues skip it (made at the
    # first, per store).
    _prefetch_skips: dict[ZoneId, int] | None = None

    def _entries_to_take(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        max_items: int,
        now: int,
        horizon_ms: int,
        *,
        snapshot: bool = False,
    ) -> tuple[list[tuple[bytes, str, int | None]], int | None]:
        """What a dequeue takes: vested entries first (invariant 6 among what is taken),
        then, in the room left, those vesting within ``horizon_ms``; and the vesting time
        of a vested entry read beyond them (None: not seen). Each read asks for one entry
        more than it may take: in a zone with a backlog (the common visit of a busy
        tenant) that entry tells the requeue the zone's next vesting time for free.

        One read to the horizon does for both when it leaves room or finds nothing ahead:
        then it holds every vested entry (a full read without entries ahead is the vested
        read's prefix). Only a full read with entries ahead falls back to two (a visit to a
        zone with a few items, the common case, reads each range once, not twice).

        ``snapshot``: the order is read without conflicts (see :meth:`dequeue`).
        """
        if not horizon_ms:
            entries = self._vested_entries(tr, zone, max_items + 1, now, snapshot=snapshot)
            return entries[:max_items], _vesting_of(entries[max_items:], now)
        upto = self._vested_entries(tr, zone, max_items + 1, now + horizon_ms, snapshot=snapshot)
        vested: list[tuple[bytes, str, int | None]] = []
        ahead: list[tuple[bytes, str, int | None]] = []
        for entry in upto:
            vesting = entry[2]
            (vested if vesting is None or vesting <= now else ahead).append(entry)
        if len(upto) <= max_items:
            return vested + ahead, None  # every entry to the horizon: none left
        if not ahead:
            return vested[:max_items], _vesting_of(vested[max_items:], now)
        entries = self._vested_entries(tr, zone, max_items, now, snapshot=snapshot)
        seen = {item_id for _, item_id, _ in entries}
        more = self._vested_entries(
            tr, zone, max_items + len(entries), now + horizon_ms, snapshot=snapshot
        )
        return entries + [e for e in more if e[1] not in seen][: max_items - len(entries)], None

    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        horizon_ms: int = 0,
        start_now: int | None = None,
        budget: TransactionBudget | None = None,
        left: Left | None = None,
        tr: KVTransaction = OWN_STORE,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Peek and lease in one transaction (``tr``: a Manager's one-transaction visit).

        Expired (TTL) and corrupt items go to dead letters here, so neither can block the
        zone (invariant 8). With ``horizon_ms``, when the vested items leave room, items
        vesting within that many ms that nobody holds are leased too, each lease counted
        from its vesting time (its vesting is the returned ``vesting_ms`` minus
        ``lease_ms``): the consumer starts them on its own timer, never before then. An
        item leased by someone else is never taken before that lease runs out.

        ``start_now``: how many of the vested items leased start at once (the consumer's
        free workers): their runs are counted at the grant; the rest, and every item taken
        ahead of its vesting time, are leased held (``WorkItem.held``), their runs counted
        by the start check (:meth:`start`), so a crash of their consumer counts nothing
        against them. None: all vested items start at once.

        At most what ``budget`` (:mod:`.budget`) lets the transaction carry is taken, and
        always one item (None: a budget of the defaults for this dequeue alone). A
        one-transaction visit passes one budget to each zone's dequeue, so a batch of
        zones is bounded as one; a retry of the dequeue's own transaction charges again
        from where the budget stood at this call.

        ``left``: told what the dequeue saw left in the zone (:class:`Left`).

        In a transaction of its own (no ``tr``: the paper's three-transaction visit) the
        zone's order is read without conflicts: an enqueue committed meanwhile (a busy
        tenant's producer, every few ms) does not make the dequeue run again. What it
        leases is read with conflicts (each record), so no item is leased twice; what it
        saw left only ever makes the pointer vest sooner; and the pointer's requeue reads
        the zone, with conflicts, in its own transaction. Inside a caller's ``tr`` (a
        one-transaction visit, whose requeue may rest on what this read) it conflicts
        as any read does.
        """
        check_lease_duration(lease_ms)
        if horizon_ms < 0:
            raise ValueError(f"horizon_ms must be at least 0, not {horizon_ms}")
        budget = TransactionBudget() if budget is None else budget
        return self._dequeue(
            zone,
            max_items,
            lease_ms,
            accept=accept,
            resolve=resolve,
            horizon_ms=horizon_ms,
            start_now=start_now,
            budget=budget,
            mark=budget.mark(),
            left=left,
            order_snapshot=tr is OWN_STORE,
            tr=tr,
        )

    @transactional
    def _dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None,
        resolve: Callable[[WorkItem], WorkItem] | None,
        horizon_ms: int,
        start_now: int | None,
        budget: TransactionBudget,
        mark: tuple[int, int, int, bool],
        left: Left | None,
        order_snapshot: bool = False,
        tr: KVTransaction = OWN_STORE,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        budget.rewind(mark)  # each try of this dequeue's own transaction charges anew
        now = now_ms(self.clock)
        leased: list[WorkItem] = []
        corrupt: list[CorruptItem] = []
        starting = max_items if start_now is None else start_now
        # A small zone whole in one storage read: its order entries, records and count
        # are read several times over by this dequeue and the pointer's requeue.
        self._prefetch(tr, zone)
        entries, vested_left = self._entries_to_take(
            tr, zone, max_items, now, horizon_ms, snapshot=order_snapshot
        )
        if left is not None:
            left.vested_ms = vested_left
        start = 0
        while start < len(entries):
            part = entries[start : start + budget.items_to_read(FIRST_READ)]
            start += len(part)
            keys = [self.keys.item_key(zone, item_id) for _, item_id, _ in part]
            # A part's item reads sent at once: one round trip for many items.
            for (order_key, item_id, _), key, raw in zip(
                part, keys, get_many(tr, keys), strict=True
            ):
                if raw is None:
                    # An order entry without its item: repair the index.
                    tr.clear(order_key)
                    continue
                try:
                    item = self._decode(tr, zone, key, raw)
                except CorruptRecord as err:
                    if not budget.admit(len(raw)):  # dead-lettered: its bytes written again
                        return leased, corrupt
                    self._dead_letter_raw(tr, zone, item_id, raw, err.reason, now)
                    tr.clear_range(*self.keys.items_range_of(zone, item_id))
                    tr.clear(order_key)
                    tr.add(self.keys.count_key(zone), pack_i64(-1))
                    corrupt.append(CorruptItem(item_id, err.reason))
                    continue
                chunks = int(item.meta.get("_chunks", 0))
                chunk_bytes = len(item.payload) if chunks else 0
                if resolve is not None:
                    item = resolve(item)
                if item.deadline_ms is not None and now > item.deadline_ms:
                    # Buried: its whole record, chunks too, written again.
                    if not budget.admit(len(raw), 2 * chunk_bytes, chunks):
                        return leased, corrupt
                    self._bury(tr, zone, item, "expired: not started before its TTL")
                    continue
                if item.vesting_ms > now and item.lease_id is not None:
                    continue  # ahead of time, but its holder's lease still runs
                if accept is not None and not accept(item):
                    continue  # e.g. its job type is at its concurrency cap: leave it vested
                # Past the budget the rest stays vested for the next visit (a place the
                # accept reserved for this item is given back when the caller settles).
                if not budget.admit(len(raw), chunk_bytes, chunks):
                    return leased, corrupt
                # At-most-once items are leased like any other: the consumer deletes one
                # (holding its lease) only when its handler starts, so an item taken but
                # never started (shutdown, a concurrency cap) is given back, not lost.
                since = max(now, item.vesting_ms)  # an item taken ahead: from its vesting
                # Held: taken ahead (it waits for its timer) or beyond the free workers.
                held = since > now or starting <= 0
                if not held:
                    starting -= 1
                leased.append(
                    self._grant_lease(
                        tr, zone, item, since, lease_ms, held=held, order_key=order_key
                    )
                )
        return leased, corrupt

    def first_reads(self, zone: ZoneId, max_items: int) -> list[tuple[bytes, bytes, int]]:
        """The ranges a dequeue of ``zone`` taking up to ``max_items`` reads first, as
        ``(begin, end, limit)`` for a read ahead (kv.read_ahead): the zone whole where it
        may be small (:meth:`_prefetch`: one pair more than that prefetch keeps, so that a
        zone too big for it is known so without another read), and its order entries'
        first ``max_items`` + 1 (:meth:`_entries_to_take`)."""
        reads = []
        skips = self._prefetch_skips
        if not (skips and skips.get(zone)):
            reads.append((*self.keys.zone_range(zone), ZONE_PREFETCH_KEYS + 1))
        reads.append((*self.keys.order_range(zone), max_items + 1))
        return reads

    def _prefetch(self, tr: KVTransaction, zone: ZoneId) -> None:
        """The zone whole in one storage read where it is small (:func:`prefetch_range`),
        not tried for a while after it was found too big (its read thrown away)."""
        skips = self._prefetch_skips
        if skips is None:
            skips = self._prefetch_skips = {}
        wait = skips.get(zone)
        if wait:
            skips[zone] = wait - 1
            return
        if prefetch_range(tr, *self.keys.zone_range(zone), ZONE_PREFETCH_KEYS) is False:
            if len(skips) >= PREFETCH_SKIPS_MAX:
                skips.clear()
            skips[zone] = PREFETCH_SKIPS
        elif wait is not None:
            del skips[zone]


def _vesting_of(beyond: list[tuple[bytes, str, int | None]], now: int) -> int | None:
    """The vesting time of the vested entry read beyond what a dequeue takes (a FIFO
    entry, vested since its enqueue, as ``now``); None when there is none."""
    if not beyond:
        return None
    vesting = beyond[0][2]
    return now if vesting is None else vesting
