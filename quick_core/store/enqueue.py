"""The two-part enqueue (paper section 6; docs/design.md "Enqueue and pointers"), composed here
and nowhere else.

Part one runs inside the enqueuing transaction: the zone store writes the item (record,
order entry, count), then the pointer check reads the zone's *pointer index* entry (never
the pointer record, so no consumer's pointer lease aborts the enqueue, invariant 3) and
creates the pointer if it is absent.

Part two is a separate best-effort transaction after part one commits: if the pointer
already existed it may vest later than the new item, so pull its vesting earlier. It is
registered with :meth:`KVTransaction.on_commit` of the transaction part one ran in, so it
follows the commit whoever commits it (``Quick.transact``, ``kv.run``, a transactional
handler's ``ctx.tr``, or a caller's ``tr.commit()``), and a failed or retried attempt
drops it. Part two never fails the enqueuer. Where the store can read keys in part one's
commit once its writes are in place (SQLite, PostgreSQL: ``kv.read_after_commit``), part
two first looks at the index entry and pointer record read there, as its own transaction
would read them, and needs no transaction of its own when the pointer is leased or
already vests in time (the usual case: one transaction an enqueue). Where part one's
commit holds the store's write lock (SQLite: ``kv.follow_in_commit``), part two runs under
that lock right after it and needs no transaction of its own at all.

External-store mode (items in Cassandra, paper section 6.1): the item is written first,
then a KV transaction reads the pointer index and creates the pointer or declares a write
conflict on the index key; if that transaction fails the item is collected and the error
raised. Part two as above.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from quickzones.clock import now_ms
from quickzones.store import flow_keys, outcomes
from quickzones.store.kv import (
    KVStore,
    KVTransaction,
    follow_in_commit,
    holds_commit_lock,
    read_after_commit,
    run,
)
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.toplevel import UNREAD, GuardedPointer, TopLevelQueue, Unread
from quickzones.store.zonestore import NewItem

log = logging.getLogger("quick.enqueue")

# Runs inside the transaction that creates or checks the pointer: the app's enqueue-rate
# charge, so an over-limit enqueue commits nothing.
Charge = Callable[[KVTransaction], None]


@dataclass(frozen=True, slots=True)
class Written:
    """What the zone store's item write did: the id, the item's vesting time, and whether
    it wrote anything (False: the id was already in the zone, an idempotent no-op)."""

    item_id: str
    vesting_ms: int
    new: bool
    # Why nothing was written: "queued" (the id, or the idempotency key's holder, is in
    # the zone) or the state of an item finished within its dedupe window or key TTL
    # ("completed", ...); "debounced" when the write replaced the key's queued item;
    # None when a new item was written.
    duplicate: str | None = None


class Enqueued(str):
    """An enqueue's item id (a ``str``) that also says whether the enqueue was a no-op:
    ``duplicate`` is None when the item was written, else "queued" (the id, or the
    idempotency key's holder, is already in its zone) or the state of the item of this id
    (or key) that finished within its job type's dedupe window or the key's TTL
    ("completed", "dead_lettered", "cancelled"); "debounced" when the enqueue replaced
    its debounce key's queued item (the id returned is that item's)."""

    duplicate: str | None

    def __new__(cls, item_id: str, duplicate: str | None = None) -> Enqueued:
        out = super().__new__(cls, item_id)
        out.duplicate = duplicate
        return out


class ItemWriter(Protocol):
    """A zone store whose items live in the KV store (the step part one needs)."""

    def write_new_item(self, tr: KVTransaction, zone: ZoneId, item: NewItem) -> Written:
        """Write the item, its order entry and count in ``tr``; no pointer work."""
        ...

    def queued_item(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> WorkItem | None:
        """The queued item of this id as ``tr`` sees it (a snapshot read), payload
        included; None when absent or unreadable until commit (written by ``tr``)."""
        ...

    def take_unleased(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> WorkItem | None:
        """Delete and return the item of this id if queued and not leased (a conflicting
        read); None when gone or leased."""
        ...


class _Attempts:
    """The items each attempt of one enqueue's transaction writes: a generated id is
    fresh (:attr:`NewItem.fresh_id`, no read of its record) in the first attempt only, as
    a later one may follow an attempt that committed (``commit_unknown_result``)."""

    def __init__(self, items: Sequence[NewItem]) -> None:
        self._items = items
        self._tried = False

    def next(self) -> Sequence[NewItem]:
        if not self._tried:
            self._tried = True
            return self._items
        return [replace(i, fresh_id=False) if i.fresh_id else i for i in self._items]


def pointer_check(
    tr: KVTransaction,
    toplevel: TopLevelQueue,
    zone: ZoneId,
    vesting_ms: int,
    *,
    declare_conflict: bool = False,
    index: bytes | Unread | None = UNREAD,
    index_key: bytes | None = None,
) -> None:
    """Part one's pointer half, in ``tr``: create the zone's pointer if its index entry is
    absent; if present, register part two to run once ``tr`` commits. ``index``: the
    entry as already read in ``tr`` from ``index_key`` (see
    :meth:`TopLevelQueue.ensure_pointer`). Where the store makes the check itself at the
    commit (:meth:`TopLevelQueue.create_pointer_where_absent`), nothing is read here."""
    if not declare_conflict and isinstance(index, Unread):
        guarded = toplevel.create_pointer_where_absent(tr, zone, vesting_ms)
        if guarded is not None:
            tr.on_commit(lambda: _after_guarded_commit(toplevel, zone, vesting_ms, guarded))
            return
    found = toplevel.ensure_pointer(
        tr, zone, vesting_ms, declare_conflict=declare_conflict, index=index, index_key=index_key
    )
    if found is None:
        return
    if holds_commit_lock(tr):
        # Part two is apart only so that a consumer's pointer lease cannot abort the
        # enqueue (invariant 3); nothing commits while ``tr`` holds the lock, so it joins
        # part one: one read of the pointer record, no transaction of its own.
        toplevel.pull_pointer_earlier(zone, vesting_ms, tr=tr, found=found)
        return
    # Part two itself rides part one's commit where the store can make it there
    # (PostgreSQL); its reads too (one transaction instead of two when, as usual, the
    # pointer already vests in time, or was pulled in the commit).
    toplevel.pull_at_commit(tr, zone, vesting_ms, found)
    keys = toplevel.after_commit_keys(zone, found)
    after = read_after_commit(tr, keys)
    active_ms = now_ms(toplevel.clock)  # read here: not under the lock (pull_pointer_earlier)
    if follow_in_commit(
        tr,
        lambda locked: toplevel.pull_pointer_earlier(
            zone, vesting_ms, tr=locked, found=found, active_ms=active_ms
        ),
        lambda read: not toplevel.pulled_already(found, [read.get(k) for k in keys], vesting_ms),
    ):
        # The same, where part one's commit holds the store's write lock (SQLite): part
        # two commits right after it under that lock, a transaction of its own that no
        # other commit can come between, so it cannot conflict with a pointer lease, and
        # the pointer vests with the item's commit (a scan between the two would have
        # left a small tenant's item waiting for the next). Those reads answer its own
        # (SQLiteStore._follow): when the pointer vests in time it reads and writes nothing.
        return
    # Part two's own transaction runs only when those reads say it has something to do, or
    # were not made.

    def follow() -> None:
        values = None if after is None else after()
        if values is not None:
            toplevel.after_pull_at_commit(zone, values[1])
            if toplevel.pulled_already(found, values, vesting_ms):
                return
        # Read just after the commit, those values answer part two's first read too.
        read = None if values is None else dict(zip(keys, values, strict=True))
        part_two(toplevel, zone, vesting_ms, after_own_commit=read)

    tr.on_commit(follow)


def _after_guarded_commit(
    toplevel: TopLevelQueue, zone: ZoneId, vesting_ms: int, guarded: GuardedPointer
) -> None:
    """Part two where the store made part one's pointer check: nothing when the commit
    made the pointer, or found one that is leased or vests in time (read just after its
    COMMIT); else part two's own transaction, whose first read those values answer."""
    read = guarded.values()
    if read is None:
        part_two(toplevel, zone, vesting_ms)
        return
    index, raw = read
    toplevel.after_pull_at_commit(zone, raw)
    if index == guarded.pointer_id:
        # Made by this commit, vesting with the item; known now, so that the zone's next
        # enqueue can pull it in its own commit (TopLevelQueue.pull_at_commit).
        toplevel.found_by_guard(zone, guarded, index)
        return
    if index is None:  # gone already (its zone drained and collected): part two looks
        part_two(toplevel, zone, vesting_ms)
        return
    found = toplevel.found_by_guard(zone, guarded, index)
    if toplevel.pulled_already(found, [index, raw], vesting_ms):
        return
    keys = toplevel.after_commit_keys(zone, found)
    part_two(
        toplevel, zone, vesting_ms, after_own_commit=dict(zip(keys, (index, raw), strict=True))
    )


def part_one(
    tr: KVTransaction,
    toplevel: TopLevelQueue,
    zones: ItemWriter,
    zone: ZoneId,
    item: NewItem,
    *,
    charge: Charge | None = None,
) -> Written:
    """Part one in ``tr`` (the caller's transaction or our own), part two registered on
    its commit. Reads the pointer index entry, never a pointer record."""
    if charge is not None:
        charge(tr)
    flow = item.flow
    first_ms = 0
    merged = False
    held: flow_keys.KeyRecord | None = None
    if flow is not None:
        now = now_ms(toplevel.clock)
        held = flow_keys.holder(tr, toplevel.keys, zone, flow, now)
        if flow.kind == flow_keys.ONE_AT_A_TIME:
            pass  # written below, after the dedupe window's check
        elif flow.kind == flow_keys.IDEMPOTENCY:
            if held is not None and held.item_id != item.item_id:
                return Written(held.item_id, now, False, held.state or flow_keys.QUEUED)
            first_ms = now
        else:
            item, first_ms, merged = _debounced(tr, toplevel, zones, zone, item, flow, held)
    if item.check_outcome and item.item_id is not None:
        # The dedupe window: an id that finished within it is not enqueued again. Reads
        # the outcome key with a conflict, so a racing completion is always seen.
        now = now_ms(toplevel.clock)
        state = outcomes.check_duplicate(
            tr,
            toplevel.keys,
            zone,
            item.item_id,
            item.payload,
            item.content_type,
            now,
            item.job_type,
        )
        if state is not None:
            return Written(item.item_id, now, False, state)
    if flow is not None and flow.kind == flow_keys.ONE_AT_A_TIME:
        return _one_at_a_time(tr, toplevel, zones, zone, item, flow, held, now_ms(toplevel.clock))
    written = zones.write_new_item(tr, zone, item)
    if written.new:
        if flow is not None:
            flow_keys.hold(tr, toplevel.keys, zone, flow, written.item_id, first_ms)
        pointer_check(tr, toplevel, zone, written.vesting_ms)
        return replace(written, duplicate=flow_keys.DEBOUNCED) if merged else written
    _check_same_job(tr, zones, zone, item, written.item_id)
    return Written(written.item_id, written.vesting_ms, False, "queued")


def _one_at_a_time(
    tr: KVTransaction,
    toplevel: TopLevelQueue,
    zones: ItemWriter,
    zone: ZoneId,
    item: NewItem,
    flow: flow_keys.FlowKey,
    held: flow_keys.KeyRecord | None,
    now: int,
) -> Written:
    """Part one of an item with a one-at-a-time key: it takes the key when it is free (an
    item as any other); else it is parked behind the holder, in enqueue order, with no
    order entry and no pointer check (its holder, in this zone, keeps the pointer; the
    key's release makes it visible and pulls the pointer, :mod:`.flow_keys`)."""
    item = replace(item, fifo=False)  # a parked item's order entry is keyed by its vesting
    if held is None or held.item_id == item.item_id:
        written = zones.write_new_item(tr, zone, item)
        if not written.new:
            return _already_queued(tr, zones, zone, item, written)
        flow_keys.hold(tr, toplevel.keys, zone, flow, written.item_id, now)
        pointer_check(tr, toplevel, zone, written.vesting_ms)
        return written
    item = replace(item, meta={**item.meta, **flow.meta(held.next_seq)})
    written = zones.write_new_item(tr, zone, item)
    if not written.new:
        return _already_queued(tr, zones, zone, item, written)
    keys = toplevel.keys
    tr.clear(keys.order_key(zone, item.priority, written.vesting_ms, written.item_id))
    flow_keys.wait(tr, keys, zone, flow, held, written.item_id)
    return written


def _debounced(
    tr: KVTransaction,
    toplevel: TopLevelQueue,
    zones: ItemWriter,
    zone: ZoneId,
    item: NewItem,
    flow: flow_keys.FlowKey,
    held: flow_keys.KeyRecord | None,
) -> tuple[NewItem, int, bool]:
    """A debounced enqueue's item: the key's queued, unleased item is taken out of ``tr``
    and ``item`` (the newest payload) takes its id and the first enqueue's time; its
    vesting is min(first + max_wait, now + wait). Returns (item, first_ms, merged)."""
    now = toplevel.clock.now() * 1000  # unrounded: vesting_after rounds once, up
    first = int(now)
    merged = False
    if held is not None:
        previous = zones.take_unleased(tr, zone, held.item_id)
        if previous is not None:
            first, merged = held.first_ms, True
            item = replace(item, item_id=previous.item_id, fresh_id=False)
    vests = min(first + flow.max_wait_ms, now + flow.wait_ms)
    return replace(item, delay_ms=max(0.0, vests - now), fifo=False), first, merged


def _already_queued(
    tr: KVTransaction, zones: ItemWriter, zone: ZoneId, item: NewItem, written: Written
) -> Written:
    """A one-at-a-time enqueue whose id is queued already: the same job, reported as a
    duplicate (nothing written)."""
    _check_same_job(tr, zones, zone, item, written.item_id)
    return Written(written.item_id, written.vesting_ms, False, flow_keys.QUEUED)


def _check_same_job(
    tr: KVTransaction, zones: ItemWriter, zone: ZoneId, item: NewItem, item_id: str
) -> None:
    """An id already queued: only the same job (type and payload) is an idempotent
    repeat; a different one is reported, never silently dropped (issue 28, point 8)."""
    queued = zones.queued_item(tr, zone, item_id)
    if queued is None:
        return
    if queued.job_type != item.job_type:
        raise outcomes.DuplicateItemMismatch(str(zone), item_id, "queued", "job type")
    if (queued.payload, queued.content_type) != (item.payload, item.content_type):
        raise outcomes.DuplicateItemMismatch(str(zone), item_id, "queued")


def part_two(
    toplevel: TopLevelQueue,
    zone: ZoneId,
    vesting_ms: int,
    *,
    after_own_commit: Mapping[bytes, bytes | None] | None = None,
) -> None:
    """Pull the zone's idle pointer to ``vesting_ms`` if it vests later. Never raises: the
    caller's transaction has committed, and a pointer that vests late still vests.
    ``after_own_commit``: what part one's commit read of part two's keys just after its
    COMMIT (:func:`~quickzones.store.kv.follows_own_commit`)."""
    try:
        toplevel.pull_pointer_earlier(zone, vesting_ms, after_own_commit=after_own_commit)
    except Exception:
        log.warning("enqueue part two for %s failed; its pointer vests later", zone, exc_info=True)


def enqueue(
    db: KVStore | KVTransaction,
    toplevel: TopLevelQueue,
    zones: ItemWriter,
    zone: ZoneId,
    item: NewItem,
    *,
    charge: Charge | None = None,
) -> str:
    """Both parts: given a store, in a transaction of its own (retried); given a caller's
    transaction, part one joins it and part two follows its commit."""
    attempts = _Attempts([item])
    written = run(
        db, lambda tr: part_one(tr, toplevel, zones, zone, attempts.next()[0], charge=charge)
    )
    return Enqueued(written.item_id, written.duplicate)


def enqueue_batch(
    db: KVStore | KVTransaction,
    toplevel: TopLevelQueue,
    zones: ItemWriter,
    zone: ZoneId,
    items: Sequence[NewItem],
    *,
    charge: Charge | None = None,
) -> list[str]:
    """Several items into one zone in one transaction; one pointer check, at the earliest
    vesting time of the items it wrote."""
    attempts = _Attempts(items)

    def write(tr: KVTransaction) -> list[str]:
        batch = attempts.next()
        if charge is not None:
            charge(tr)
        many = getattr(zones, "write_new_items", None)
        index: bytes | Unread | None = UNREAD
        index_key = toplevel.index_key(zone)
        written: list[Written]
        if many is not None and all(item.fresh_id for item in batch):
            # No id to read: the pointer check reads alone, or not at all where the store
            # makes it at the commit (TopLevelQueue.create_pointer_where_absent).
            written, _ = many(tr, zone, batch)
        elif many is not None:
            # The layout and the pointer index entry are read with the items' ids: one
            # round trip (the pointer check's own read of the layout is answered locally).
            read_also = [toplevel.layout_key, index_key]
            written, [_, index] = many(tr, zone, batch, read_also=read_also)
        else:
            written = [zones.write_new_item(tr, zone, item) for item in batch]
        fresh = [w.vesting_ms for w in written if w.new]
        if fresh:
            pointer_check(tr, toplevel, zone, min(fresh), index=index, index_key=index_key)
        return [w.item_id for w in written]

    return run(db, write)


def enqueue_external(
    kv: KVStore,
    toplevel: TopLevelQueue,
    zone: ZoneId,
    *,
    write_item: Callable[[], tuple[int, bool]],
    collect_item: Callable[[], None],
    charge: Charge | None = None,
) -> None:
    """External-store mode: ``write_item()`` stores the item outside the KV store and
    returns (vesting_ms, whether it wrote it); then one KV transaction checks the pointer,
    declaring a write conflict on an existing index key so a pointer deletion that read it
    aborts. If that transaction fails, ``collect_item()`` removes what was written and the
    error is raised: the caller was never told the item exists."""
    vesting_ms, inserted = write_item()

    def pointer(tr: KVTransaction) -> None:
        if charge is not None:
            charge(tr)
        pointer_check(tr, toplevel, zone, vesting_ms, declare_conflict=True)

    try:
        run(kv, pointer)
    except BaseException:
        if inserted:
            collect_item()
        raise
