"""The Scanner: paper Algorithm 1 (choose which zones to visit).

One scan peeks the vested pointers of every shard of every cluster (shuffled) and selects
some (:mod:`~quickzones.consumer.selection`): a random ``selection_frac`` of each shard's
peek of ``peek_max`` in random mode, so consumers spread over zones; the oldest first in
order mode (the consumer that holds a cluster's scanner election, paper section 4.2), so
no pointer starves (invariant 10). What a scan selects is then ordered by how many of
this consumer's items each zone holds, fewest first (a stable sort, so the order above
breaks ties): a visit with less room than its zones want gives it to the tenants with
nothing running before a backlog that holds the rest (water-filling, kept when a slot
frees up); with ``skip_held_zones_at``, a zone already holding that many is passed over.
On a thread (:meth:`Scanner.run`) the selected pointers go to the managers' pool
(Algorithm 2). The scanner fetches; it never dequeues items nor runs them.

A scan also sets :attr:`Scanner.share`, the water-filling share of the consumer's free
capacity over the vested zones it saw (0 when it could not see them all), which
work-conserving visits (``visit_max``) take instead of ``dequeue_max`` when larger.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from contextlib import ExitStack
from typing import Any

from quickzones.clock import Clock, SystemClock
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.pool import DaemonPool
from quickzones.consumer.random_slices import RandomSlices
from quickzones.consumer.requeued_zones import RequeuedZones
from quickzones.consumer.selection import Peek, Selection, own_peek, peek_window, weighed
from quickzones.consumer.set_aside import ScanFailures, SetAside, elapsed
from quickzones.consumer.state import Cluster
from quickzones.consumer.visit_rules import visit_key
from quickzones.consumer.weighing import Weighing
from quickzones.errors import StorageError, StoreLost
from quickzones.repeated_failure import RepeatedFailure
from quickzones.store.changes import CommitWatcher
from quickzones.store.records import ZoneId
from quickzones.store.toplevel import PointerRef

log = logging.getLogger("quick.consumer")


class Scanner:
    """Algorithm 1 over a consumer's clusters."""

    def __init__(
        self,
        config: ConsumerConfig,
        clusters: dict[str, Cluster],
        rng: random.Random,
        *,
        in_order_for: Callable[[str], bool],
        refresh_election: Callable[[], None],
        capacity: Callable[[], int],
        emit: Callable[..., Any],
        skip: Callable[[PointerRef], bool] = lambda ref: False,
        clock: Clock | None = None,
        lookahead_ms: int = 0,
        held: Callable[[PointerRef], int] = lambda ref: 0,
        weighing: Weighing | None = None,
        watchers: Sequence[CommitWatcher] = (),
        on_lost: Callable[[StoreLost], None] = lambda err: None,
        set_aside: SetAside | None = None,
        peek: Peek | None = None,
        zone_of: Callable[[tuple[str, int, str]], ZoneId | None] | None = None,
        slices: RandomSlices | None = None,
    ) -> None:
        self.config = config
        self.clusters = clusters
        self.rng = rng
        self.in_order_for = in_order_for
        self.refresh_election = refresh_election
        self.capacity = capacity
        self.emit = emit
        self.skip = skip  # pointers not to visit (another app's, when routed)
        self.held = held  # items this consumer holds from a pointer's zone now
        # Each pointer's tenant weight for this scan (quickzones.consumer.weighing), or
        # None when no weight is stored: the unweighted scan.
        self.weighing = weighing
        self.share = 0  # free capacity per vested zone at the last scan
        self.clock = clock or SystemClock()
        # The earliest vesting time (store ms) of the pointers the last scan saw not yet
        # vested, in the shards it peeked: the idle scanner sleeps until then.
        self.next_vesting_ms: int | None = None
        self.left_vested = False  # the last scan saw vested pointers it did not choose
        # Timer lookahead (:meth:`run` only): pointers vesting this soon count as vested,
        # their items are leased ahead and started on the consumer's timers.
        self.lookahead_ms = lookahead_ms
        self._looked_ahead_ms = 0  # the horizon of the last scan
        self._wake = threading.Event()
        self._room = threading.Event()  # room freed up in a full consumer (room_freed)
        self.requeued = RequeuedZones()  # told by visits: whether the next scan can wait
        # The stores' commit watchers (``commit_poll_s``); counters read before a scan.
        self.watchers = list(watchers)
        self._versions: list[int | None] = [None] * len(self.watchers)
        # Zones whose visits failed on their own, each passed over on its own backoff
        # (quickzones.consumer.set_aside); the store's failures back the scanner off.
        self.set_aside = set_aside = set_aside or SetAside(emit, monotonic=elapsed(self.clock))
        self.on_lost = on_lost  # the store went away (its file deleted): the consumer stops
        self.failures = ScanFailures(set_aside, RepeatedFailure(log, "manager visits"), on_lost)
        # How a shard's vested pointers are peeked (a pull leaser's pages one app's).
        self.peek: Peek = peek or own_peek(config)
        # Random-mode scans between full peeks read a slice at a random place (with the
        # scanner's own peek only: a pull leaser's pages one app's zones).
        if slices is None and peek is None:
            slices = RandomSlices(own_peek(config), rng, monotonic=elapsed(self.clock))
        self.slices = slices
        self.zone_of = zone_of  # each pointer's zone where the peek read it (for weights)

    def wake(self) -> None:
        """Scan now (a local enqueue, or a stop): ends the scanner's idle wait."""
        self._wake.set()
        self._room.set()

    def room_freed(self) -> None:
        """An item finished or a visit left room unfilled: ends a full consumer's wait
        for a free worker, and no other wait (a visit that took less than it might does
        not make an idle scanner rescan)."""
        self._room.set()

    def idle_wait(self, stopping: threading.Event, *, on_commits: bool = False) -> None:
        """Sleep ``idle_sleep_s``, or less: until the earliest vesting time the last scan
        saw (exact timers) or a :meth:`wake`. Idle, a consumer polls no more often than
        ``idle_sleep_s``.

        ``on_commits`` (the last scan found nothing to visit): a commit to a watched store
        since that scan began (another process's enqueue) ends the wait too. Not after
        visits that took nothing: each of them committed, and consumers that all refuse
        a zone's items would otherwise wake each other with every visit. Where every
        store it serves signals commits (:meth:`_signalled`), that wait is up to
        a third of ``election_ttl_s`` (a safety poll, 1.7 s by default: the scanner renews
        its election then anyway) instead of ``idle_sleep_s``, and the
        watchers read their counters only when signalled or at that tick: an idle
        consumer costs next to nothing (issue 44 point 4)."""
        cfg = self.config
        poll_s = cfg.commit_poll_s
        # Only when the last scan saw nothing vested: zones passed over for what this
        # consumer holds (a tenant weighted down holds its share at once) are due again
        # as soon as an item of theirs ends, not at the safety poll.
        signalled = on_commits and poll_s is not None and not self.left_vested
        signalled = signalled and self._signalled()
        if signalled:
            # Never past the scanner election's next renewal (run() renews between waits).
            poll_s = cfg.election_ttl_s / 3
        timeout = self.until_next_vesting(poll_s if signalled else None)
        if timeout > 0 and not stopping.is_set():
            with ExitStack() as watching:
                if on_commits and poll_s is not None:
                    for watcher, since in zip(self.watchers, self._versions, strict=True):
                        if since is not None:
                            watching.enter_context(
                                watcher.watching(self._wake.set, since, tick_s=poll_s)
                            )
                self._wake.wait(timeout)
        self._wake.clear()

    def _signalled(self) -> bool:
        """Whether a commit to any store this consumer serves would wake it through a
        watcher that sleeps on the store's own signal: every cluster's pointer store has
        a signalled watcher (an enqueue commits its pointer there)."""
        if not self.watchers or not all(w.signalled for w in self.watchers):
            return False
        return len({id(c.toplevel.kv) for c in self.clusters.values()}) <= len(self.watchers)

    def until_next_vesting(self, cap_s: float | None = None) -> float:
        """Seconds until the earliest vesting time the last scan saw, at most ``cap_s``
        (``idle_sleep_s`` when None)."""
        timeout = self.config.idle_sleep_s if cap_s is None else cap_s
        if self.next_vesting_ms is not None:
            # A hair past the millisecond it vests in (less the lookahead), so that scan
            # sees it.
            due = self.next_vesting_ms - self._looked_ahead_ms
            until = (due + 0.05 - self.clock.now() * 1000) / 1000
            timeout = max(0.0, min(timeout, until))
        return timeout

    def scan_once(
        self, horizon_ms: int = 0, pending: int = 0, *, watch: bool = True
    ) -> list[PointerRef]:
        """Peek the shards of every cluster (shuffled) and choose pointers to visit.

        In random mode, a random ``selection_frac`` of each shard's peeked pointers (at
        most ``selection_max`` in all) so that consumers spread over zones. In order mode
        (this consumer holds a cluster's election), the oldest vested pointers across all
        that cluster's shards first, so no pointer starves (invariant 10). With
        ``horizon_ms`` pointers vesting within that many ms count as vested. ``pending``:
        zones handed to visits that have not yet taken the room they will take.
        ``watch``: read the commit counters first, for :meth:`idle_wait` after it.
        """
        cfg = self.config
        # What came before its peeks they see: no other scan for a wake-up or a requeue.
        self._wake.clear()
        self.requeued.clear()
        if watch:
            # Before the peeks: a commit after this is one the scan may have missed.
            self._versions = [watcher.version() for watcher in self.watchers]
        targets = [(c, shard) for c in self.clusters.values() for shard in range(c.toplevel.shards)]
        self.rng.shuffle(targets)
        weight = None if self.weighing is None else self.weighing.by_pointer(self.zone_of)
        selection = Selection(cfg, self.rng, weight)
        room = max(1, self.capacity() - pending)  # zones kept at most (below)
        holds_none = lambda ref: self.held(ref) == 0  # noqa: E731
        any_in_order = False
        competing, crowded = 0, False
        passed_over = False  # vested zones left out for what they hold
        next_vesting: int | None = None
        # Asked once per cluster and scan: the answer may take a turn (quick serve spaces
        # its in-order scans), and every shard of an in-order scan is in order.
        in_order_of: dict[str, bool] = {}
        for cluster, shard in targets:
            in_order = in_order_of.get(cluster.name)
            if in_order is None:
                in_order = in_order_of[cluster.name] = self.in_order_for(cluster.name)
            any_in_order = any_in_order or in_order
            if not in_order and selection.full:
                crowded = True  # a shard not even peeked: competition unknown
                continue
            try:
                sliced = None
                slices = None if in_order else self.slices
                if slices is not None:
                    sliced = slices.slice(cluster, shard, horizon_ms, selection.draw_size)
                if sliced is not None:
                    peeked, drawn_from, window = sliced
                    peeked, later = self._passable(peeked), None
                    self.emit("shard_sliced", pointers=len(peeked))
                else:
                    peek = functools.partial(self.peek, cluster, shard)
                    peeked, later, window = peek_window(
                        cfg, in_order, peek, horizon_ms, self._passable, room, holds_none
                    )
                    drawn_from = None
                    if slices is not None:  # a window with a weighted tenant: full peeks
                        uniform = weight is None or all(weight(r) == 1.0 for r in peeked)
                        slices.record(cluster, shard, peeked if uniform else [], window)
            except StorageError as err:
                if isinstance(err, StoreLost):
                    self.on_lost(err)
                self.emit("scan_error", error=str(err))
                continue
            if later is not None and (next_vesting is None or later < next_vesting):
                next_vesting = later
            # Zones holding enough of this consumer's items are passed over, as if
            # crowded out: still vested (left_vested), not in the share.
            mark = cfg.skip_held_mark()
            enough = [ref for ref in peeked if self.held(ref) >= weighed(mark, ref, weight)]
            if enough:
                passed_over = True
                peeked = [ref for ref in peeked if ref not in enough]
                for ref in enough:  # served by what this consumer holds, not starved
                    self.emit("zone_held_passed_over", pointer_id=ref.pointer_id)
            if not peeked:
                continue
            vested = len(peeked) if drawn_from is None else drawn_from
            competing += vested
            crowded = crowded or vested >= window
            selection.add(peeked, in_order, drawn_from=drawn_from)
        chosen = selection.chosen()
        if weight is None:
            chosen.sort(key=self.held)
        else:  # water-filling by weight: furthest below its weighted share first
            chosen.sort(key=lambda ref: self.held(ref) / weight(ref))
        # No more zones than the room (Algorithm 1 line 5: 16 for 4 free workers went to
        # visits of which 3 in 4 leased nothing); the rest stay vested (left_vested).
        del chosen[room:]
        # Vested pointers seen and not chosen (a random sample, or past selection_max).
        self.left_vested = crowded or passed_over or competing > len(chosen)
        self.share = 0 if crowded or not competing else self.capacity() // competing
        self.next_vesting_ms = next_vesting
        self._looked_ahead_ms = horizon_ms
        self.emit("scan", pointers=len(chosen), in_order=any_in_order)
        return chosen

    def _passable(self, peeked: list[PointerRef]) -> list[PointerRef]:
        """``peeked`` less another app's zones (routing) and those set aside."""
        return [
            ref for ref in peeked if not self.skip(ref) and not self.set_aside.holds(visit_key(ref))
        ]

    def run(
        self,
        managers: DaemonPool,
        visit: Callable[[list[PointerRef]], int],
        stopping: threading.Event,
    ) -> None:
        """Algorithm 1 on a thread. Pipelined (the default): the pointers a scan selects
        wait in a local queue and go to managers as they free up, and the next scan
        comes when that queue is empty (or its pointers are ``idle_sleep_s`` x 10 old),
        so no visit waits for the slowest visit of the last scan. Otherwise each scan
        waits for all of the last one's visits. With nothing to visit, or a pass whose
        visits all took nothing (empty or throttled zones), it sleeps ``idle_sleep_s`` or
        until the earliest vesting time it saw, whichever is sooner, or until woken
        (:meth:`idle_wait`), so such zones are not polled hot and a delayed item starts on
        time. ``visit`` runs on a manager, given up to ``visits_per_transaction`` selected
        pointers (filled before another manager is used: one transaction for as many as
        fit), and returns how many items it handed out."""
        cfg = self.config
        next_election = 0.0
        visiting: dict[Future[int], list[tuple[str, int, str]]] = {}
        selected: deque[PointerRef] = deque()
        selected_at = 0.0
        found_none_last = True  # the last scan chose nothing (or none was made yet)
        since_scan: set[tuple[str, int, str]] = set()  # visits given or ended since it
        while not stopping.is_set():
            mono = time.monotonic()
            if mono >= next_election:
                self.refresh_election()
                next_election = mono + cfg.election_ttl_s / 3
            finished = {f: visiting.pop(f) for f in [f for f in visiting if f.done()]}
            for keys in finished.values():
                since_scan.update(keys)
            took = [f.result() for f in finished if f.exception() is None]
            if self.failures.backed_off(finished, stopping, self.emit):
                selected.clear()  # chosen before the failure: scan afresh after the wait
                continue
            if self.capacity() <= 0:
                # Algorithm 1, line 5: everything this consumer may hold is held; scan
                # again once a worker frees up (the in-flight count wakes it), so no
                # item is leased only to wait for a worker while its lease runs.
                self._room.wait(cfg.idle_sleep_s)
                self._room.clear()
                continue
            if finished and not visiting and not selected and not any(took):
                self.idle_wait(stopping)
                continue
            if finished and not visiting and not selected and self._left_later(since_scan):
                self.idle_wait(stopping, on_commits=True)  # requeued_zones.py
                continue
            if visiting and not cfg.pipelined_scans:
                futures.wait(visiting, return_when=futures.ALL_COMPLETED)
                continue
            free = cfg.managers - len(visiting)
            submitted = 0
            found_nothing = False  # this pass scanned and chose no pointer
            # Visits running take room when they lease: a scan chooses for what is left.
            if free > 0 and self._room_beyond(visiting):
                if not selected or mono - selected_at > cfg.idle_sleep_s * 10:
                    pending = sum(len(keys) for keys in visiting.values())
                    # Commit counters (for the idle wait) read only while scans find
                    # nothing; a scan without them that found nothing, before that wait,
                    # is made again with them (tests/unit/test_scanner_commit_counters.py).
                    watch = found_none_last
                    selected = deque(self.scan_once(self.lookahead_ms, pending, watch=watch))
                    if not selected and not watch and not visiting:
                        selected = deque(self.scan_once(self.lookahead_ms, pending))
                    since_scan = set()
                    selected_at = time.monotonic()
                    found_nothing = found_none_last = not selected
                busy = {key for keys in visiting.values() for key in keys}
                while selected and submitted < free:
                    # Batched visits: up to visits_per_transaction pointers per manager.
                    batch: list[PointerRef] = []
                    while selected and len(batch) < cfg.visits_at_once():
                        ref = selected.popleft()
                        key = visit_key(ref)
                        if key not in busy and not self.set_aside.holds(key):
                            busy.add(visit_key(ref))
                            batch.append(ref)
                    if not batch:
                        continue
                    visiting[managers.submit(visit, batch)] = keys = [visit_key(r) for r in batch]
                    since_scan.update(keys)
                    submitted += 1
            room = self._room_beyond(visiting)
            if not visiting:
                self.idle_wait(stopping, on_commits=found_nothing)
            elif free <= 0 or not selected or not room:
                # Managers all busy, every selected pointer handed out, or the room all
                # promised to visits running: go on when a manager frees up (or after the
                # idle sleep), not at once; with a manager free, also when the next
                # pointer vests (a timer is not held up by a visit to another zone).
                if free > submitted and submitted and self.left_vested and room:
                    continue  # managers and room free, vested pointers left: scan again
                timeout = cfg.idle_sleep_s if free <= 0 else self.until_next_vesting()
                futures.wait(visiting, timeout, futures.FIRST_COMPLETED)

    def _left_later(self, since_scan: set[tuple[str, int, str]]) -> bool:
        """No peek needed, no visit running (:mod:`.requeued_zones`); sets the timer."""
        if self.left_vested or not self.watchers or None in self._versions:
            return False
        later, soonest = self.requeued.all_later(since_scan)
        if later and soonest is not None:
            ahead = self.next_vesting_ms
            self.next_vesting_ms = soonest if ahead is None else min(ahead, soonest)
        return later

    def _room_beyond(self, visiting: dict[Future[int], list[tuple[str, int, str]]]) -> bool:
        """Whether room is left beyond the zones given to the visits still running."""
        return self.capacity() > sum(len(keys) for keys in visiting.values())
