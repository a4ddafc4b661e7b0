"""Moving a tenant's queue zone to another store (the paper's user move, section 6).

Copy the zone, then the pointer, then remove the source, with no loss and no duplicate
across crashes and re-runs:

1. **Fence** a page of source items: a conditional change (on the lease id and vesting
   the mover read) gives each a mover's lease ``move:...`` for ``fence_ms``, so no source
   consumer can take, complete or requeue it while it is copied. The vesting time it
   should keep is saved in its metadata. An item already fenced by an earlier, crashed
   run is recognised by the ``move:`` prefix and taken over.
2. **Copy** the page into the target in one KV transaction: the record verbatim (id,
   priority, vesting, error count, attempts, job type, payload) with its order entry,
   count and pointer, plus a per-item marker key in the target's meta space. An item
   whose marker exists was copied before (the run crashed before step 3) and is skipped,
   so an item a target consumer already ran is never copied twice.
3. **Delete** the fenced page from the source (only items still holding the fence).

When the zone is empty the source pointer is deleted by a transaction that read the
pointer index and observed the zone empty (invariant 2); then one target transaction
writes the zone's done marker and clears its item markers. Items leased by a consumer are
left until their lease ends (the mover waits up to ``lease_wait_s``) unless
``include_leased``: then the lease is taken over, and a run in progress may run again in
the target (at-least-once), but nothing is lost.

The tenant's flow keys (:mod:`quickzones.store.flow_keys`: idempotency, debounce and
one-at-a-time records, a one-at-a-time key's waiting items) go first, before any item, to
the target where it has none of the key, so a duplicate is refused there as soon as its
item can run there, and an item waiting for its key is copied waiting (no order entry:
:meth:`~quickzones.store.zones.writes.ZoneWrites.import_item` asks the copied record).
Once the source is empty, :func:`settle_flow_keys` hands on the keys whose holder finished
on the source during the move (it was running) and removes the source's keys.

The source is a :class:`MoveSource`: :class:`KVMoveSource` here, a Cassandra source in
``quickzones.adapters.cassandra.migrate``. The target is always a KV deployment (:class:`Quick`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgpack

from quickzones.clock import Clock, SystemClock, now_ms
from quickzones.errors import CorruptRecord, QuickError
from quickzones.store import flow_keys
from quickzones.store.kv import KVTransaction, run
from quickzones.store.records import WorkItem, ZoneId

if TYPE_CHECKING:
    from quickzones.client import Quick
    from quickzones.store.zones import KVZoneStore

FENCE_PREFIX = "move:"
FENCE_VESTING_META = "_moved_vs"  # the vesting time the copy keeps
DEFAULT_FENCE_MS = 3_600_000


class MoveIncomplete(QuickError):
    """A zone could not be emptied: items stayed leased past the wait, or counts differ."""

    def __init__(self, zone: ZoneId, reason: str) -> None:
        super().__init__(f"move of {zone} incomplete: {reason}")
        self.zone = zone
        self.reason = reason


class MoveSource(Protocol):
    """The operations a tenant move needs from where the zone lives now."""

    def list_items(self, zone: ZoneId) -> Iterator[WorkItem]:
        """Every item of the zone, leased or not (pages, no lease taken)."""
        ...

    def fence(self, zone: ZoneId, items: Sequence[WorkItem], fence_id: str) -> list[WorkItem]:
        """Lease each item (as read) to the mover; returns the fenced items. An item that
        changed since it was read is left out (the next pass reads it again)."""
        ...

    def delete_fenced(self, zone: ZoneId, items: Sequence[WorkItem]) -> None:
        """Delete the items that still hold the fence the given records carry."""
        ...

    def drop_pointer_if_empty(self, zone: ZoneId) -> bool:
        """Delete the zone's source pointer if a strong read shows the zone empty."""
        ...

    def count(self, zone: ZoneId) -> int: ...


@dataclass(slots=True)
class MoveReport:
    """What one zone's move did; ``ok`` is the final count check."""

    zone: ZoneId
    moved: int = 0  # copied by this run
    moved_total: int = 0  # copied by every run of this move (the target's markers)
    source_before: int = 0
    source_after: int = 0
    skipped_leased: int = 0
    pointer_dropped: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.source_after == self.skipped_leased == 0


def is_fence(lease_id: str | None) -> bool:
    return lease_id is not None and lease_id.startswith(FENCE_PREFIX)


def new_fence_id() -> str:
    return FENCE_PREFIX + secrets.token_hex(12)


def fenced_copy(item: WorkItem, fence_id: str, now: int, fence_ms: int) -> WorkItem:
    """The source row while fenced: the mover's lease, and the vesting the copy keeps (an
    unleased item's own; a taken-over lease's item vests now)."""
    keep = item.vesting_ms if item.lease_id is None else min(item.vesting_ms, now)
    return item.with_(
        lease_id=fence_id,
        vesting_ms=now + fence_ms,
        meta={**item.meta, FENCE_VESTING_META: keep},
    )


def target_record(fenced: WorkItem) -> WorkItem:
    """The record written to the target: unleased, at the vesting time it had."""
    meta = {k: v for k, v in fenced.meta.items() if k != FENCE_VESTING_META}
    return fenced.with_(lease_id=None, vesting_ms=int(fenced.meta[FENCE_VESTING_META]), meta=meta)


def _marker_key(target: Quick, zone: ZoneId, item_id: str) -> bytes:
    # (root, "m", "move", app, tenant, "i", item_id) -> b""  (copied; skip on a re-run)
    return target.keys.meta_key("move", zone.app, zone.tenant, "i", item_id)


def done_key(target: Quick, zone: ZoneId) -> bytes:
    # (root, "m", "move", app, tenant, "done") -> msgpack {run, moved, at}
    return target.keys.meta_key("move", zone.app, zone.tenant, "done")


def read_done(target: Quick, zone: ZoneId) -> dict[str, object] | None:
    raw = run(target.kv, lambda tr: tr.get(done_key(target, zone), snapshot=True))
    if raw is None:
        return None
    done: dict[str, object] = msgpack.unpackb(raw, raw=False)
    return done


def _copy_page(target: Quick, zone: ZoneId, fenced: Sequence[WorkItem]) -> int:
    """Step 2 in one target transaction; returns how many items were copied now."""

    def copy(tr: KVTransaction) -> int:
        copied = 0
        for item in fenced:
            marker = _marker_key(target, zone, item.item_id)
            if tr.get(marker) is not None:
                continue  # copied by an earlier run that crashed before deleting it
            target.zones.import_item(tr, zone, target_record(item))
            tr.set(marker, b"")
            copied += 1
        return copied

    copied = run(target.kv, copy)
    if fenced:
        earliest = min(int(i.meta[FENCE_VESTING_META]) for i in fenced)
        target.toplevel.pull_pointer_earlier(zone, earliest)
    return copied


def _count_markers(target: Quick, zone: ZoneId) -> int:
    begin, end = target.keys.meta_range("move", zone.app, zone.tenant, "i")
    total = 0
    cursor = begin
    while True:
        rows = run(
            target.kv,
            lambda tr, c=cursor: tr.get_range(c, end, limit=1000, snapshot=True),  # type: ignore[misc]
        )
        total += len(rows)
        if len(rows) < 1000:
            return total
        cursor = rows[-1][0] + b"\x00"


def _finish(target: Quick, zone: ZoneId, run_id: str, moved_total: int, now: int) -> None:
    begin, end = target.keys.meta_range("move", zone.app, zone.tenant, "i")

    def finish(tr: KVTransaction) -> None:
        tr.clear_range(begin, end)
        record = {"run": run_id, "moved": moved_total, "at": now}
        tr.set(done_key(target, zone), msgpack.packb(record, use_bin_type=True))

    run(target.kv, finish)


def _pages(items: Iterator[WorkItem], size: int) -> Iterator[list[WorkItem]]:
    page: list[WorkItem] = []
    for item in items:
        page.append(item)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


def move_zone(
    source: MoveSource,
    target: Quick,
    zone: ZoneId,
    *,
    run_id: str | None = None,
    include_leased: bool = False,
    lease_wait_s: float = 60.0,
    page_size: int = 100,
    clock: Clock | None = None,
    on_moved: Callable[[int], None] | None = None,
) -> MoveReport:
    """Move one zone from ``source`` into ``target`` (see the module docstring).

    Idempotent and resumable: run it again after a crash at any point and every item ends
    in the target exactly once. ``on_moved(n)`` is called after each copied page.
    """
    clock = clock or SystemClock()
    run_id = run_id or secrets.token_hex(8)
    fence_id = new_fence_id()
    report = MoveReport(zone, source_before=source.count(zone))
    # Flow keys live in a KV source only (Cassandra zones have none).
    kv_source = source.quick if isinstance(source, KVMoveSource) else None
    if kv_source is not None:
        copy_flow_keys(kv_source, target, zone)
    deadline = time.monotonic() + lease_wait_s
    while True:
        now = now_ms(clock)
        waiting: list[WorkItem] = []
        for page in _pages(source.list_items(zone), page_size):
            ready: list[WorkItem] = []
            for item in page:
                busy = item.lease_id is not None and item.vesting_ms > now
                if busy and not is_fence(item.lease_id) and not include_leased:
                    waiting.append(item)
                else:
                    ready.append(item)
            if not ready:
                continue
            fenced = source.fence(zone, ready, fence_id)
            copied = _copy_page(target, zone, fenced)
            source.delete_fenced(zone, fenced)
            report.moved += copied
            if on_moved is not None and copied:
                on_moved(copied)
        if not waiting:
            break
        if time.monotonic() >= deadline:
            report.skipped_leased = len(waiting)
            report.notes.append(f"{len(waiting)} items still leased after {lease_wait_s:.0f}s")
            break
        # Sleep until the first lease ends (or the wait is over), then take another pass.
        first_end = min(i.vesting_ms for i in waiting) / 1000 - clock.now()
        clock.sleep(max(0.05, min(first_end + 0.05, deadline - time.monotonic())))
    report.source_after = source.count(zone)
    report.moved_total = _count_markers(target, zone)
    if report.source_after == 0:
        report.pointer_dropped = source.drop_pointer_if_empty(zone)
        if kv_source is not None:
            settle_flow_keys(kv_source, target, zone)
        _finish(target, zone, run_id, report.moved_total, now_ms(clock))
    elif report.source_after != report.skipped_leased:
        report.notes.append(
            f"source has {report.source_after} items, {report.skipped_leased} of them leased: "
            "items were enqueued into the source during the move; run it again"
        )
    return report


# --- flow keys -----------------------------------------------------------------------------


def _flow_rows(quick: Quick, zone: ZoneId) -> list[tuple[bytes, bytes]]:
    """Every flow key row of ``zone`` (records and waiting items): one tenant's keys."""
    begin, end = quick.keys.flow_keys_range(zone)
    return run(quick.kv, lambda tr: tr.get_range(begin, end, snapshot=True))


def _target_key(source: Quick, target: Quick, zone: ZoneId, key: bytes) -> tuple[bytes, str, str]:
    """(the row's key in the target, kind, key name): a record (…, kind, name) or a
    waiting item (…, "w", name, seq)."""
    parts = source.keys.unpack(key)
    kind, name = str(parts[3]), str(parts[4])
    if len(parts) > 5:
        seq = parts[5]
        assert isinstance(seq, int)
        return target.keys.flow_wait_key(zone, name, seq), kind, name
    return target.keys.flow_key(zone, kind, name), kind, name


def copy_flow_keys(source: Quick, target: Quick, zone: ZoneId) -> None:
    """The source's flow keys of ``zone`` into the target where it has none of the key
    (a re-run, or keys of the target's own, keep theirs), with the expiry entries of TTL
    holds, in one target transaction."""
    rows = _flow_rows(source, zone)
    if not rows:
        return

    def copy(tr: KVTransaction) -> None:
        for key, value in rows:
            new_key, kind, name = _target_key(source, target, zone, key)
            if tr.get(new_key) is not None:
                continue
            tr.set(new_key, value)
            if kind == "w":
                continue
            try:
                until = flow_keys.decode_record(key, value).until_ms
            except CorruptRecord:
                continue
            if until:
                tr.set(target.keys.flow_expiry_key(until, zone, kind, name), b"")

    run(target.kv, copy)


def settle_flow_keys(source: Quick, target: Quick, zone: ZoneId) -> None:
    """After the source zone emptied: a key the target still has held by a live item that
    is not in the target finished on the source during the move: a one-at-a-time key
    passes to its next waiting item, another takes the source's record (a TTL hold) or is
    freed. Then the source's keys of the zone are removed."""
    source_keys = source.keys.flow_keys_range(zone)
    left = {_target_key(source, target, zone, k)[0]: v for k, v in _flow_rows(source, zone)}

    def settle(tr: KVTransaction) -> None:
        begin, end = target.keys.flow_keys_range(zone)
        for key, value in tr.get_range(begin, end):
            parts = target.keys.unpack(key)
            if len(parts) > 5:
                continue  # a waiting item
            kind, name = str(parts[3]), str(parts[4])
            try:
                record = flow_keys.decode_record(key, value)
            except CorruptRecord:
                continue
            live = tr.get(target.keys.item_key(zone, record.item_id)) is not None
            if record.until_ms or live:
                continue  # a TTL hold, or its holder is here: the target's own
            if kind == flow_keys.ONE_AT_A_TIME:
                turn = flow_keys.pass_on(tr, target.keys, zone, name, record)
                target.zones.take_turn(tr, zone, turn)
                continue
            kept = left.get(key)
            until = 0 if kept is None else flow_keys.decode_record(key, kept).until_ms
            if kept is not None and until:
                tr.set(key, kept)
                tr.set(target.keys.flow_expiry_key(until, zone, kind, name), b"")
            else:
                tr.clear(key)

    run(target.kv, settle)
    run(source.kv, lambda tr: tr.clear_range(*source_keys))


# --- a KV source ---------------------------------------------------------------------------


class KVMoveSource:
    """A zone in a KV deployment, the source of a KV-to-KV tenant move.

    Uses the KV zone store's record helpers directly: fencing and deleting are item-level
    changes in one transaction per page that the public zone API has no call for.
    """

    def __init__(self, quick: Quick, *, clock: Clock | None = None) -> None:
        self.quick = quick
        self.zones: KVZoneStore = quick.zones
        self.keys = quick.keys
        self.clock = clock or quick.clock

    def list_items(self, zone: ZoneId, page_size: int = 500) -> Iterator[WorkItem]:
        begin, end = self.keys.order_range(zone)
        cursor = begin
        while True:

            def page(
                tr: KVTransaction, start: bytes = cursor
            ) -> tuple[list[WorkItem], bytes | None]:
                rows = tr.get_range(start, end, limit=page_size, snapshot=True)
                items = []
                for key, _ in rows:
                    _, _, item_id = self.keys.unpack_order_key(zone, key)
                    try:
                        item = self.zones._read_item(tr, zone, item_id, snapshot=True)
                    except CorruptRecord:
                        continue  # dead-lettered by the source's consumers, not moved
                    if item is not None:
                        items.append(item)
                last = rows[-1][0] + b"\x00" if len(rows) == page_size else None
                return items, last

            items, cursor_next = run(self.quick.kv, page)
            yield from items
            if cursor_next is None:
                break
            cursor = cursor_next
        yield from self._waiting_items(zone)

    def _waiting_items(self, zone: ZoneId) -> Iterator[WorkItem]:
        """The items waiting for a one-at-a-time key (no order entry), in key order."""

        def read(tr: KVTransaction) -> list[WorkItem]:
            begin, end = self.keys.flow_keys_range(zone)
            out = []
            for key, value in tr.get_range(begin, end, snapshot=True):
                if len(self.keys.unpack(key)) <= 5:
                    continue  # a key's record
                try:
                    item = self.zones._read_item(tr, zone, value.decode(), snapshot=True)
                except CorruptRecord:
                    continue
                if item is not None:
                    out.append(item)
            return out

        yield from run(self.quick.kv, read)

    def fence(self, zone: ZoneId, items: Sequence[WorkItem], fence_id: str) -> list[WorkItem]:
        def fence(tr: KVTransaction) -> list[WorkItem]:
            now = now_ms(self.clock)
            out = []
            for seen in items:
                current = self.zones._read_item(tr, zone, seen.item_id)
                if current is None:
                    continue
                if is_fence(current.lease_id):
                    out.append(current)  # ours, from this or a crashed earlier run
                    continue
                if (current.lease_id, current.vesting_ms) != (seen.lease_id, seen.vesting_ms):
                    continue  # changed since the listing: the next pass sees it again
                fenced = fenced_copy(current, fence_id, now, DEFAULT_FENCE_MS)
                out.append(self.zones._move_vesting(tr, zone, current, fenced))
            return out

        return run(self.quick.kv, fence)

    def delete_fenced(self, zone: ZoneId, items: Sequence[WorkItem]) -> None:
        def delete(tr: KVTransaction) -> None:
            for fenced in items:
                current = self.zones._read_item(tr, zone, fenced.item_id)
                if current is not None and current.lease_id == fenced.lease_id:
                    self.zones._delete_item(tr, zone, current)

        run(self.quick.kv, delete)

    def drop_pointer_if_empty(self, zone: ZoneId) -> bool:
        return self.quick.toplevel.drop_pointer_if_empty(
            zone, lambda tr: self.zones.zone_is_empty(tr, zone)
        )

    def count(self, zone: ZoneId) -> int:
        return self.zones.count(zone)


def move_tenant(
    source: Quick,
    target: Quick,
    app: str,
    tenant: str,
    *,
    include_leased: bool = False,
    lease_wait_s: float = 60.0,
    page_size: int = 100,
    on_moved: Callable[[int], None] | None = None,
) -> MoveReport:
    """Move the zone (app, tenant) from one KV deployment to another."""
    zone = source.zone(app, tenant)
    if source.kv is target.kv:
        from quickzones.errors import ConfigurationError

        raise ConfigurationError("source and target are the same store")
    for side in (source, target):
        if side.items is not side.zones:
            # Items kept outside the KV zones (zones=sql, Cassandra's): the move reads
            # and writes KV item keys, which would find none there (or hide its own).
            from quickzones.errors import UnsupportedByStore

            raise UnsupportedByStore(
                "a tenant move", "KV zones", type(side.items).__name__,
                "it moves items of the KV layout only; nothing was moved",
            )  # fmt: skip
    return move_zone(
        KVMoveSource(source),
        target,
        zone,
        include_leased=include_leased,
        lease_wait_s=lease_wait_s,
        page_size=page_size,
        clock=source.clock,
        on_moved=on_moved,
    )
