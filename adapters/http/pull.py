"""Leases for pull consumers: the scanner's and manager's steps (paper Algorithms 1 and 2)
run on behalf of a remote worker, through the same top-level queue and zone store calls
the local consumer makes.

One :meth:`PullLeaser.lease` call scans the vested pointers of every shard (filtered to
the caller's app), leases a pointer, dequeues at most ``dequeue_max`` items of its zone
(water-filling, invariant 7), requeues or collects the pointer, and moves on to the next
zone until it holds ``max_items`` items (or, if the caller gave ``fill_s``, holds some and
``fill_s`` has passed since its scan began, so they do not wait behind many more visits).
The oldest
vested pointer is always among the zones visited, so no zone waits forever behind busier
ones (invariant 10); the rest are a random sample, so concurrent pull consumers spread
over zones.

When the consumer package exposes its scanner and manager as separate parts
(``quickzones.consumer.scanner`` / ``manager``), this module should call them instead of
repeating the visit.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from quickzones.clock import now_ms
from quickzones.consumer.visit_gate import OneTransactionGate
from quickzones.errors import ItemNotFound, LeaseLost, StorageError, ZoneLeaseFailed
from quickzones.store.changes import watcher_for
from quickzones.store.keys import LOCAL_APP
from quickzones.store.kv import KVTransaction, _Uncommitted, attempt_once, run
from quickzones.store.records import WorkItem, ZoneId, decode_pointer
from quickzones.store.toplevel import PointerRef
from quickzones.store.zonestore import VisitTransactions, ZoneStore

if TYPE_CHECKING:
    from quickzones.client import Quick


@dataclass(frozen=True, slots=True)
class PullConfig:
    """The scanner and manager parameters a server uses for its pull consumers."""

    peek_max: int = 200  # vested pointers read per shard and page
    pages_max: int = 5  # pages read past other apps' pointers to find the caller's
    selection_frac: float = 0.3
    dequeue_max: int = 10
    pointer_lease_s: float = 1.0
    min_inactive_s: float = 5.0
    # Long poll: the longest wait between empty scans, as a local consumer's idle_sleep_s;
    # an enqueue through this server, or (SQLite) a commit by another process, wakes it.
    poll_s: float = 0.02
    poll_max_s: float = 0.02
    # As ConsumerConfig.one_transaction_visits: a visit's pointer lease, dequeue and
    # requeue commit once where the zones live in the pointers' store.
    one_transaction_visits: bool = False


_ZONES_REMEMBERED = 100_000  # pointer ids whose zone a leaser keeps (then starts over)


@dataclass(frozen=True, slots=True)
class Leased:
    zone: ZoneId
    item: WorkItem


class PullLeaser:
    """Leases items for remote workers out of one Quick's top-level queue."""

    def __init__(self, q: Quick, config: PullConfig | None = None) -> None:
        self.q = q
        self.config = config or PullConfig()
        self.one_transaction = OneTransactionGate(self.config.one_transaction_visits)
        self.rng = random.Random()
        self._stats_lock = threading.Lock()
        self.leased_total = 0
        # Pickup latency (lease time minus enqueue time) of recent first attempts, for
        # the dashboard (a delayed item counts its delay too).
        self._pickups: deque[int] = deque(maxlen=2000)
        # Set by an enqueue through this server's Quick: waiting long polls scan at once.
        self._enqueued = threading.Condition()
        self._generation = 0
        q.wake_on_enqueue(self)
        self._zone_of: dict[tuple[str, int, str], ZoneId] = {}  # see _remember_zone
        # Commits by other processes (quickzones.store.changes), on stores that can tell.
        self._changes = 0
        self._watcher = watcher_for(q.kv)

    def wake(self) -> None:
        with self._enqueued:
            self._generation += 1
            self._enqueued.notify_all()

    def pickup_percentiles(self) -> tuple[int | None, int | None]:
        """p50 and p99 pickup latency (ms) of the last 2000 first deliveries."""
        with self._stats_lock:
            seen = sorted(self._pickups)
        if not seen:
            return None, None
        return seen[len(seen) // 2], seen[min(len(seen) - 1, (len(seen) * 99) // 100)]

    # --- the scanner ---------------------------------------------------------------------

    def _remember_zone(self, cluster: str, shard: int, pointer_id: str, zone: ZoneId) -> None:
        """A pointer's zone never changes (a zone that loses its pointer gets a new id),
        so scans read each pointer's record once, not at every scan."""
        if len(self._zone_of) >= _ZONES_REMEMBERED:
            self._zone_of.clear()
        self._zone_of[(cluster, shard, pointer_id)] = zone

    def _vested(self, shard: int, app: str | None) -> list[tuple[PointerRef, ZoneId]]:
        """Vested pointers of one shard whose zone belongs to ``app`` (None: any app but
        the cluster's local work), oldest first; snapshot reads, no conflicts."""
        top = self.q.toplevel
        keys = self.q.keys
        begin, end = keys.pointer_vested_range(top.cluster, shard, now_ms(self.q.clock))
        out: list[tuple[PointerRef, ZoneId]] = []
        for _ in range(self.config.pages_max):

            def page(tr: KVTransaction, start: bytes = begin) -> list[tuple[PointerRef, ZoneId]]:
                tr.set_causal_read_risky()
                rows = tr.get_range(start, end, limit=self.config.peek_max, snapshot=True)
                found = []
                for key, _ in rows:
                    vesting, pointer_id = keys.unpack_pointer_vesting_key(top.cluster, shard, key)
                    zone = self._zone_of.get((top.cluster, shard, pointer_id))
                    if zone is None:
                        pkey = keys.pointer_key(top.cluster, shard, pointer_id)
                        raw = tr.get(pkey, snapshot=True)
                        if raw is None:
                            continue
                        zone = decode_pointer(pkey, raw).zone
                        self._remember_zone(top.cluster, shard, pointer_id, zone)
                    found.append((PointerRef(shard, pointer_id, vesting, top.cluster), zone))
                return found

            rows = run(self.q.kv, page)
            out.extend(
                (ref, zone)
                for ref, zone in rows
                if zone.app != LOCAL_APP and (app is None or zone.app == app)
            )
            if out or len(rows) < self.config.peek_max:
                break
            last = rows[-1][0]
            begin = keys.pointer_vesting_key(top.cluster, shard, last.vesting_ms, last.pointer_id)
            begin += b"\x00"
        return out

    def _choose(self, app: str | None) -> list[PointerRef]:
        candidates: list[tuple[PointerRef, ZoneId]] = []
        for shard in range(self.q.toplevel.shards):
            try:
                candidates.extend(self._vested(shard, app))
            except StorageError:
                continue
        if not candidates:
            return []
        candidates.sort(key=lambda c: c[0].vesting_ms)
        oldest, rest = candidates[0][0], [c[0] for c in candidates[1:]]
        k = min(len(rest), max(1, round(self.config.selection_frac * len(rest))))
        return [oldest, *self.rng.sample(rest, k)]

    # --- the manager -----------------------------------------------------------------------

    def _visit(
        self, ref: PointerRef, room: int, lease_ms: int, accept: Callable[[WorkItem], bool] | None
    ) -> list[Leased] | None:
        """The items leased in the zone; None if its pointer could not be leased (nothing
        was committed)."""
        cfg = self.config
        zones = self.q.items
        room = min(room, cfg.dequeue_max)
        window = room
        if accept is not None:
            # A filter looks at the zone's first dequeue_max vested items (a local
            # consumer's concurrency caps see the same window) and takes at most ``room``;
            # the ids taken make a retried transaction take the same ones again.
            window = cfg.dequeue_max
            taken: set[str] = set()
            wanted = accept

            def accept_room(item: WorkItem) -> bool:
                if item.item_id in taken:
                    return True
                if len(taken) >= room or not wanted(item):
                    return False
                taken.add(item.item_id)
                return True

            accept = accept_room
        if zones.capabilities.one_transaction_visits and self.one_transaction.try_one():
            return self._visit_in_one_transaction(ref, window, lease_ms, accept)
        return self._visit_in_three_transactions(ref, window, lease_ms, accept)

    def _visit_in_three_transactions(
        self,
        ref: PointerRef,
        window: int,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
    ) -> list[Leased] | None:
        """Pointer lease, dequeue, requeue: paper Algorithm 2's three transactions."""
        cfg = self.config
        top = self.q.toplevel
        zones = self.q.items
        try:
            pointer = top.obtain_pointer_lease(ref, int(cfg.pointer_lease_s * 1000))
        except ZoneLeaseFailed:
            return None  # another consumer took it, or it moved
        zone = pointer.zone
        items: list[WorkItem] = []
        try:
            items, _corrupt = zones.dequeue(zone, window, lease_ms, accept=accept)
            # The remote worker asks only for what its free workers start at once: each
            # item's run starts now (counted, and a lapse of it counted as a lapse).
            items = _start_each(zones, zone, items, lease_ms)
        except StorageError:
            pass  # the pointer is released below; the zone is tried again later
        try:
            top.requeue_pointer(
                pointer,
                lambda tr: zones.min_vesting_ms(zone, tr=tr),
                lambda tr: zones.zone_is_empty(tr, zone),
                min_inactive_ms=int(cfg.min_inactive_s * 1000),
                active=bool(items),
            )
        except StorageError:
            pass  # the pointer lease lapses and the pointer vests again
        return [Leased(zone, item) for item in items]

    def _visit_in_one_transaction(
        self,
        ref: PointerRef,
        window: int,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
    ) -> list[Leased] | None:
        """The same visit committed once (``one_transaction_visits``); None if the pointer
        could not be leased or the visit failed (nothing was committed)."""
        cfg = self.config
        top = self.q.toplevel
        zones = cast(VisitTransactions, self.q.items)

        def visit(tr: KVTransaction) -> list[Leased]:
            pointer = top.lease_pointer(ref, int(cfg.pointer_lease_s * 1000), tr=tr)
            zone = pointer.zone
            items, _corrupt = zones.dequeue(zone, window, lease_ms, accept=accept, tr=tr)
            # Started at once by the remote worker's free workers (see above).
            items = [zones.start(zone, i.item_id, i.lease_id or "", lease_ms, tr=tr) for i in items]
            top.requeue_pointer(
                pointer,
                lambda t: self.q.items.min_vesting_ms(zone, tr=t),
                lambda t: self.q.items.zone_is_empty(t, zone),
                min_inactive_ms=int(cfg.min_inactive_s * 1000),
                active=bool(items),
                tr=tr,
            )
            return [Leased(zone, item) for item in items]

        try:
            done = attempt_once(top.kv, visit)
        except (ZoneLeaseFailed, StorageError):
            return None  # another consumer took it, it moved, or the store failed
        if isinstance(done, _Uncommitted):
            self.one_transaction.conflicted()
            return self._visit_in_three_transactions(ref, window, lease_ms, accept)
        self.one_transaction.committed()
        return done

    def lease_once(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        job_types: frozenset[str] | None = None,
        fill_s: float | None = None,
    ) -> list[Leased]:
        """One scan and the visits it chooses; may return nothing. With ``fill_s``, once
        it holds items it visits no more zones ``fill_s`` after the scan began."""
        return self._lease_once(app, max_items, lease_s, job_types, fill_s)[0]

    def _lease_once(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        job_types: frozenset[str] | None,
        fill_s: float | None = None,
    ) -> tuple[list[Leased], int]:
        """The items leased, and how many zones' pointers were leased (and released: two
        commits each) for them."""
        accept = None if job_types is None else (lambda item: item.job_type in job_types)
        out: list[Leased] = []
        visited = 0
        fill_until = math.inf if fill_s is None else time.monotonic() + fill_s
        for ref in self._choose(app):
            room = max_items - len(out)
            if room <= 0 or (out and time.monotonic() >= fill_until):
                break
            got = self._visit(ref, room, int(lease_s * 1000), accept)
            if got is not None:
                visited += 1
                out.extend(got)
        now = now_ms(self.q.clock)
        with self._stats_lock:
            self.leased_total += len(out)
            for x in out:
                if x.item.attempts <= 1:
                    self._pickups.append(max(0, now - x.item.enqueued_ms))
        return out, visited

    def lease(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        wait_s: float,
        job_types: frozenset[str] | None = None,
        stopping: threading.Event | None = None,
        fill_s: float | None = None,
    ) -> list[Leased]:
        """Up to ``max_items`` leased items; waits up to ``wait_s`` for the first one (a
        long poll, like SQS's ReceiveMessage). With ``fill_s`` a scan that holds items
        visits no more zones ``fill_s`` after it began, so the items it holds are handed
        out soon rather than after visits to fill ``max_items``.

        While it waits it scans again when an enqueue through this server's Quick wakes
        it; when the store tells of commits from other processes
        (:mod:`quickzones.store.changes`: SQLite), after each such commit; and at the latest
        every ``poll_s``. A scan that leased zones' pointers and got no item from them
        (their items are of job types it refuses, or another consumer was faster) made
        commits that wake the waiting polls of other servers on the same file, as theirs
        wake it (a store's own commits wake nobody): after each such scan, store changes
        count only once a wait doubling from 1 ms up to ``poll_s`` has passed since it,
        so waiting polls cannot keep each other scanning. A poll that leases nothing
        waits for a change again."""
        deadline = time.monotonic() + wait_s
        pause = self.config.poll_s
        gap = 0.0  # how long after a scan store changes do not yet count
        watcher = self._watcher if wait_s > 0 else None
        while True:
            seen = (self._generation, self._changes)
            # Commits from here on count; the watcher is only asked to watch (a thread
            # reading the counter every millisecond) while this poll waits.
            version = None if watcher is None else watcher.version()
            scanned = time.monotonic()
            got, visited = self._lease_once(app, max_items, lease_s, job_types, fill_s)
            now = time.monotonic()
            if got or now >= deadline or (stopping is not None and stopping.is_set()):
                return got
            if visited:
                gap = min(max(gap * 2, 0.001), pause)
            watch = (
                contextlib.nullcontext()
                if watcher is None or version is None
                else watcher.watching(self._store_changed, since=version)
            )
            with watch:
                self._wait(seen, scanned + gap, min(scanned + pause, deadline))
            pause = min(pause * 2, self.config.poll_max_s)

    def _store_changed(self) -> None:
        with self._enqueued:
            self._changes += 1
            self._enqueued.notify_all()

    def _wait(self, seen: tuple[int, int], changes_count_from: float, until: float) -> None:
        """Until a local enqueue, a store change seen after ``changes_count_from``, or
        ``until`` (monotonic seconds)."""
        with self._enqueued:
            while self._generation == seen[0]:
                now = time.monotonic()
                if now >= until:
                    return
                timeout = until - now
                if self._changes != seen[1]:
                    if now >= changes_count_from:
                        return
                    timeout = min(timeout, changes_count_from - now)
                self._enqueued.wait(timeout)


def _start_each(
    zones: ZoneStore, zone: ZoneId, items: list[WorkItem], lease_ms: int
) -> list[WorkItem]:
    """Mark each leased item's run started; one cancelled meanwhile is left out."""
    started = []
    for item in items:
        try:
            started.append(zones.start(zone, item.item_id, item.lease_id or "", lease_ms))
        except (LeaseLost, ItemNotFound):
            continue  # cancelled or taken over since the dequeue: never started
    return started
