"""A consumer's parameters, with the paper's names where it has one."""

from __future__ import annotations

import math
from dataclasses import dataclass

from quickzones.errors import ConfigurationError


@dataclass(slots=True)
class ConsumerConfig:
    """Consumer parameters; names follow the paper where it has one."""

    # Algorithm 1's choice (issue 29): a random-mode scanner peeks a large window of each
    # shard's vested pointers and leases a small random share of it, so consumers that
    # scan at once rarely pick the same pointer (a lost pointer lease is a wasted visit).
    # The chance two pick the same is about selection_frac: 8 consumers over 1,000 zones
    # lost 6.6 % of their pointer leases (4 processes, FoundationDB) with 100 and 0.2, and
    # 1.3 % with 1,000 and 0.01; all 8 scanning at the same instant, 41 % against 3.7 %.
    # Pointers a random-mode full peek of a shard reads; the scans between full peeks
    # (at most REFRESH_S apart) read a slice at a random place of that window instead
    # (quickzones.consumer.random_slices).
    peek_max: int = 1000
    selection_frac: float = 0.01  # share of peeked pointers a random scanner leases
    selection_max: int = 16  # at most this many per scan
    # The most items this consumer holds at once: leased and waiting for a worker (or
    # for their timer), or running. A scan comes only when some of it is free and a
    # visit takes at most what is free (paper Algorithm 1, line 5). None: ``workers``,
    # so nothing waits for a worker (only a timer's look-ahead waits, timer_lookahead_s)
    # and no item is kept from another consumer with idle workers (issue 40 point 2).
    # Larger: a look-ahead; what waits beyond the free workers is leased held (its run
    # counted only when it starts, so a crash charges it nothing) and its lease is
    # renewed while it waits, kept from every other consumer meanwhile.
    processing_bound: int | None = None
    dequeue_max: int = 10  # items one visit takes from one zone (water-filling)
    # Work-conserving visits (beyond the paper): a visit takes the water-filling share of
    # this consumer's free capacity over the zones its last scan saw competing, never
    # less than dequeue_max nor more than this; None: no cap but the free capacity (a
    # tenant alone fills the free room in one visit; when many zones compete, or a scan
    # could not see them all, visits stay at dequeue_max). dequeue_max: the paper's
    # visits, always dequeue_max.
    visit_max: int | None = None
    pointer_lease_s: float = 1.0  # p_duration
    min_inactive_s: float = 5.0  # empty zone's pointer lives this long before GC
    item_lease_s: float = 30.0
    lease_extend_s: float | None = None  # default: a third of the item lease
    # Zone visits at once. Each waits mostly on its store (PostgreSQL's and FoundationDB's
    # round trips, SQLite's write lock), so more overlap: 8 against 4, side by side, drained
    # PostgreSQL 1,104-1,138 against 868-970 items/s with small tenants' p99 29-30 against
    # 34-47 ms, and changed nothing measurable on SQLite or FoundationDB (docs/performance.md).
    managers: int = 8
    workers: int = 8
    idle_sleep_s: float = 0.02
    shutdown_deadline_s: float = 10.0
    election_ttl_s: float = 5.0
    # Expired outcome records (status, results, dedupe) are cleared about this often.
    outcome_gc_interval_s: float = 10.0
    in_order: bool | None = None  # None: take part in the election; True/False: force
    # Scan again whenever a manager is free (lower latency), or only once the last scan's
    # visits all finished (False: bigger batches per visit, a few % more throughput).
    pipelined_scans: bool = True
    # One commit per visit (beyond the paper): where the zones live in the pointers' KV
    # store, a Manager leases the pointer, dequeues and requeues the pointer in one
    # transaction instead of three; apps with dispatch limits keep the three, and a visit
    # that conflicts falls back to them (visit_gate). False: the paper's three transactions
    # everywhere. The default since a quiet 2-core A/B (bench/results/README.md,
    # 20261126T1215Z-defaults): with the three settings below, small tenants' p99 pickup
    # under the noisy neighbour 78 -> 40 ms (lower in 28 of 30 pairs), throughput level.
    one_transaction_visits: bool = True
    # Batched visits (beyond the paper, with one_transaction_visits): a manager that frees
    # up takes up to this many of the zones a scan selected and visits them all in one
    # transaction, each still taking at most its dequeue_max; under load (many small
    # zones, each needing a visit of its own) the store makes one commit for them instead
    # of one each. A batch that conflicts, or meets an app with dispatch limits, is
    # written off and its zones visited one by one. 1: one zone per visit. Without
    # one_transaction_visits every visit is one zone's (visits_at_once).
    visits_per_transaction: int = 4
    # Exact timers (beyond the paper): a running consumer leases items that vest within
    # this many seconds ahead, where the zone store can (every KV backend), and starts each
    # on its own timer at its vesting time, never before; the visit's commits are then
    # behind it, not in its lateness. An item another consumer holds is never taken before
    # that lease ends. 0: items are leased once vested. Single-threaded driving
    # (``run_until_idle``) never looks ahead.
    timer_lookahead_s: float = 0.05
    # Wake-ups on other processes' commits (beyond the paper), where the store can tell
    # cheaply (SQLite's PRAGMA data_version; FoundationDB's watch of its wake key): an
    # idle consumer whose last scan found nothing to visit reads the store's commit
    # counter this often and
    # rescans when another process or connection committed (its own process's commits
    # through the same store do not count), instead of waiting for its next idle_sleep_s
    # poll: an enqueue from the application's process is picked up within about this
    # long. No store round trip, but CPU while idle: about 3% of a core more at 5 ms, 4%
    # at 2 ms, 6% at 1 ms (on top of ~2% for the default 20 ms idle polls; the
    # benchmarks' fairness profile uses 1 ms). None: poll only.
    # Where the store signals commits (PostgreSQL's NOTIFY of enqueues; a SQLite file on
    # Linux, through inotify) the idle wait sleeps on that signal instead
    # (Scanner.idle_wait), with a safety poll of a third of election_ttl_s, when the
    # scanner renews its election anyway.
    commit_poll_s: float | None = 0.005
    # The completion flusher's pace (beyond the paper): after each commit of finished
    # items it waits this long, so under load one commit carries the completions of that
    # span instead of a handful each; every commit competes with the visits for the
    # store's write lock and the interpreter. A completion (its status, result, dedupe
    # record) is then committed up to this much later; a stop completes what finished at
    # once. 0: flush as soon as anything finished (each commit then carries a handful).
    completion_flush_s: float = 0.01
    # Beyond the paper: a scan passes over a zone of which this consumer already holds at
    # least this many items (queued locally or running); a visit still takes up to
    # dequeue_max. While a backlog fills the workers, visiting its zone each scan costs
    # the visit (about 1 ms of CPU per zone on sqlite) and only queues more of its items
    # locally; the scan's visits go to the zones holding fewer. None: the number of
    # workers (below that a lone tenant's workers wait for its next visit); a larger
    # number lets a scan visit such zones more often.
    skip_held_zones_at: int | None = None
    seed: int | None = None
    # Routing (beyond the paper): only zones of these apps and items of these job types
    # (None: all). An item of a type not handled here is left for a consumer that handles
    # it, never settled here; once it has been due this long it is reported at ERROR, once
    # per type (None: never).
    apps: tuple[str, ...] | None = None
    job_types: tuple[str, ...] | None = None
    unhandled_grace_s: float | None = 600.0
    # How long a worker waits for a slot of a full named limit (docs/limits.md) before it
    # gives its item back unstarted: a slot freed meanwhile, here or on another consumer,
    # is taken again at once instead of idling until the item's next visit.
    limit_wait_s: float = 1.0

    def visits_at_once(self) -> int:
        """Zones one manager visits in one transaction: ``visits_per_transaction`` where
        visits are one transaction, else 1 (the paper's three transactions are per zone)."""
        return self.visits_per_transaction if self.one_transaction_visits else 1

    def skip_held_mark(self) -> int:
        """``skip_held_zones_at``, or ``workers`` when it is None."""
        return self.workers if self.skip_held_zones_at is None else self.skip_held_zones_at

    def held_bound(self) -> int:
        """``processing_bound``, or ``workers`` when it is None."""
        if self.processing_bound is None:
            return self.workers
        return self.processing_bound

    def validate(self) -> None:
        if not 0 < self.selection_frac <= 1:
            raise ConfigurationError("selection_frac must be in (0, 1]")
        for name in ("peek_max", "selection_max", "dequeue_max"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1")
        bound = self.processing_bound
        whole = isinstance(bound, int) and not isinstance(bound, bool)
        if bound is not None and not (whole and bound >= 1):
            raise ConfigurationError(
                f"processing_bound must be a whole number of at least 1, or None (workers), "
                f"not {bound!r}"
            )
        if self.visit_max is not None and self.visit_max < self.dequeue_max:
            raise ConfigurationError(
                f"visit_max ({self.visit_max}) must be at least dequeue_max "
                f"({self.dequeue_max}), or None"
            )
        if isinstance(self.visits_per_transaction, bool) or not (
            isinstance(self.visits_per_transaction, int) and self.visits_per_transaction >= 1
        ):
            raise ConfigurationError(
                f"visits_per_transaction must be an integer of at least 1, "
                f"not {self.visits_per_transaction!r}"
            )
        if self.managers < 1 or self.workers < 1:
            raise ConfigurationError("managers and workers must be at least 1")
        if not self.outcome_gc_interval_s > 0:
            raise ConfigurationError("outcome_gc_interval_s must be positive")
        for name in ("apps", "job_types"):
            names = getattr(self, name)
            if names is None:
                continue
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
                raise ConfigurationError(f"{name} must be a tuple of non-empty names, or None")
            if not names:
                raise ConfigurationError(f"{name} must name at least one, or be None (all)")
        if self.unhandled_grace_s is not None and not self.unhandled_grace_s >= 0:
            raise ConfigurationError("unhandled_grace_s must be at least 0, or None (never)")
        mark = self.skip_held_zones_at
        if mark is not None and (isinstance(mark, bool) or not isinstance(mark, int) or mark < 1):
            raise ConfigurationError(
                f"skip_held_zones_at must be a whole number of at least 1, or None, not {mark!r}"
            )
        if not 0 <= self.completion_flush_s < math.inf:
            raise ConfigurationError(
                f"completion_flush_s must be at least 0 and finite, not {self.completion_flush_s!r}"
            )
        if self.commit_poll_s is not None and not self.commit_poll_s > 0:
            raise ConfigurationError(
                f"commit_poll_s must be positive, or None (off), not {self.commit_poll_s!r}"
            )
        if self.pointer_lease_s <= 0 or self.item_lease_s <= 0:
            raise ConfigurationError("lease durations must be positive")
        if not 0 <= self.limit_wait_s < math.inf:
            raise ConfigurationError(
                f"limit_wait_s must be at least 0 and finite, not {self.limit_wait_s!r}"
            )
        if not 0 <= self.timer_lookahead_s <= self.item_lease_s / 2:
            raise ConfigurationError(
                f"timer_lookahead_s must be between 0 and half the item lease "
                f"({self.item_lease_s / 2:g} s), not {self.timer_lookahead_s!r}"
            )
