"""Which vested pointers a scan visits: paper Algorithm 1's choice, made here for the
consumer's :class:`~quickzones.consumer.scanner.Scanner` and the HTTP server's pull
leaser alike.

A scan peeks a window of each shard's vested pointers (oldest first, ``peek_max``) and
feeds each peek to one :class:`Selection`. In random mode it takes a random
``selection_frac`` of each peek (at least one, at most ``selection_max`` in all), so
consumers polling at once spread over the zones instead of contending for the same
pointer leases. In order (the consumer that holds a cluster's scanner election, paper
section 4.2, or one configured ``in_order=True``) it takes the oldest vested pointers
across the shards first, so no pointer starves (invariant 10).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence

from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.state import Cluster
from quickzones.store.toplevel import PointerRef

# The most pointers the in-order scanner (the election's holder) peeks a shard, at most
# ``peek_max`` (first a shorter window, in_order_window). It takes the oldest
# ``selection_max``, so it needs no random-mode window: only enough to count the competing
# zones for the work-conserving share. Past held_bound / dequeue_max
# zones that share falls below dequeue_max and visits are dequeue_max whatever the count,
# so 100 is exact for held bounds up to 1,000 (62 workers at 16 a worker); more zones than
# it sees only mark the scan crowded (share 0, visits of dequeue_max: the same visits).
# Each in-order scan reads this many pointer keys a shard; 100 was the window before issue
# 29 widened random mode's to 1,000, kept here so the one scanner's scans stay that cheap.
IN_ORDER_PEEK_MAX = 100


def in_order_window(config: ConsumerConfig) -> int:
    """Pointers an in-order scan peeks a shard first: twice ``selection_max`` (it takes
    the oldest that many, past a few it passes over), or the zones the work-conserving
    share can need counted (``held_bound // dequeue_max``; past them it is below
    ``dequeue_max`` anyway) and one more to see that there are more; at most
    ``IN_ORDER_PEEK_MAX`` and ``peek_max``. Each pointer peeked is a key read and
    decoded: with 4 workers, 100 a scan were a tenth of a one-item zone's CPU. A scan
    whose short window held fewer than ``selection_max`` zones it may visit reads the
    widest one."""
    need = max(2 * config.selection_max, config.held_bound() // config.dequeue_max + 1)
    return min(IN_ORDER_PEEK_MAX, config.peek_max, need)


def peek_window(
    config: ConsumerConfig,
    in_order: bool,
    peek: Callable[[int, int], tuple[list[PointerRef], int | None]],
    horizon_ms: int,
    passable: Callable[[list[PointerRef]], list[PointerRef]],
    room: int | None = None,
    holds_none: Callable[[PointerRef], bool] | None = None,
) -> tuple[list[PointerRef], int | None, int]:
    """One shard's peek (``peek(window, horizon_ms)``: its vested pointers and the next
    vesting time) less what the scan passes over (``passable``), and the window it read:
    ``peek_max`` in random mode, :func:`in_order_window` in order, widened to
    ``IN_ORDER_PEEK_MAX`` when the short window's head is mostly zones passed over (set
    aside after failed visits, another app's), so the oldest others further on are still
    seen (invariant 10).

    ``room``: how many zones the scan will keep (the consumer's room for items; the scan
    keeps that many of what it chose, those holding fewest of its items first, oldest
    first among equals). In order, a window of twice the room comes first: when it holds
    ``room`` zones the consumer holds nothing of (``holds_none``), they are the ones the
    scan keeps from the full window too, and the rest of it need not be read (4 free
    workers peeked 32 pointers to keep 4, a tenth of a one-item zone's CPU)."""
    windows = [in_order_window(config)] if in_order else [config.peek_max]
    if in_order and room is not None and holds_none is not None:
        short = min(windows[0], max(2 * room, 1))
        if short < windows[0]:
            windows.insert(0, short)
    widest = min(IN_ORDER_PEEK_MAX, config.peek_max)
    enough = False  # the short window holds what the scan keeps
    for window in windows:
        peeked, later = peek(window, horizon_ms)
        kept = passable(peeked)
        if len(peeked) < window or window == windows[-1]:
            break  # every vested pointer seen, or the full window read
        if room is not None and holds_none is not None and sum(map(holds_none, kept)) >= room:
            enough = True
            break
    full = len(peeked) >= window
    if in_order and full and not enough and window < widest and len(kept) < config.selection_max:
        window = widest
        peeked, later = peek(window, horizon_ms)
        kept = passable(peeked)
    return kept, later, window


class Selection:
    """One scan's choice, fed one shard's peek at a time."""

    def __init__(
        self,
        config: ConsumerConfig,
        rng: random.Random,
        weight: Callable[[PointerRef], float] | None = None,
    ) -> None:
        self.config = config
        self.rng = rng
        self.weight = weight  # tenant weights (consumer.weighing); None: a uniform draw
        self.ordered: list[PointerRef] = []  # in-order shards' peeks, whole
        self.sampled: list[PointerRef] = []  # random samples of the other shards' peeks

    @property
    def full(self) -> bool:
        """Whether random mode has all the pointers it may take (a shard not yet peeked
        need not be)."""
        return len(self.sampled) >= self.config.selection_max

    def draw_size(self, vested: int) -> int:
        """How many pointers random mode takes from a shard's peek of ``vested``."""
        cfg = self.config
        room = cfg.selection_max - len(self.sampled)
        return min(room, vested, max(1, math.ceil(cfg.selection_frac * vested)))

    def add(
        self, peeked: Sequence[PointerRef], in_order: bool, *, drawn_from: int | None = None
    ) -> None:
        """One shard's vested pointers, oldest first. ``drawn_from``: ``peeked`` is a
        slice at a random place of a window of that many
        (:mod:`~quickzones.consumer.random_slices`): random mode draws from the slice what
        it would from the window."""
        if in_order:
            self.ordered.extend(peeked)
            return
        vested = len(peeked) if drawn_from is None else drawn_from
        k = min(self.draw_size(vested), len(peeked))
        if k > 0:
            self.sampled.extend(self._sample(peeked, k))

    def _sample(self, peeked: Sequence[PointerRef], k: int) -> list[PointerRef]:
        """``k`` of ``peeked`` at random; weighted, a pointer of weight w is drawn as if it
        were w pointers (Efraimidis-Spirakis: the k largest of u ** (1 / w)). Each
        pointer's weight is looked up once: a draw costs what was peeked."""
        weights = None if self.weight is None else [self.weight(ref) for ref in peeked]
        if weights is None or all(w == 1.0 for w in weights):
            return self.rng.sample(list(peeked), k)  # the unweighted draw, as ever
        rng = self.rng
        keyed = sorted(
            zip(peeked, weights, strict=True),
            key=lambda pair: rng.random() ** (1.0 / pair[1]),
            reverse=True,
        )
        return [ref for ref, _ in keyed[:k]]

    def chosen(self) -> list[PointerRef]:
        """At most ``selection_max`` pointers: the in-order ones oldest first, then the
        random samples."""
        cap = self.config.selection_max
        chosen = sorted(self.ordered, key=lambda ref: ref.vesting_ms)[:cap]
        return chosen + self.sampled[: cap - len(chosen)]


# (cluster, shard, window, horizon_ms) -> the shard's vested pointers, oldest first, at
# most ``window``, and the vesting time of the first one not yet vested (None: unknown).
Peek = Callable[[Cluster, int, int, int], tuple[list[PointerRef], int | None]]


def peek_shard(
    cluster: Cluster,
    shard: int,
    window: int,
    horizon_ms: int,
    start: PointerRef | None = None,
    *,
    ahead_ms: int | None = None,
) -> tuple[list[PointerRef], int | None]:
    """The scanner's own :data:`Peek`: the shard's top-level queue (from ``start``'s
    place on, when given; a next vesting time at most ``ahead_ms`` past the horizon)."""
    return cluster.toplevel.peek(
        shard, window, horizon_ms=horizon_ms, start=start, ahead_ms=ahead_ms
    )


def longest_wait_ms(config: ConsumerConfig) -> int:
    """The longest an idle scanner sleeps before it scans again (``until_next_vesting``
    of :class:`~quickzones.consumer.scanner.Scanner`: ``idle_sleep_s``, or a third of
    ``election_ttl_s`` where commits wake it), in ms: a pointer vesting later than that
    past its horizon changes nothing it does now, so its peeks look no further
    (:meth:`~quickzones.store.toplevel.TopLevelQueue.peek`'s ``ahead_ms``)."""
    return math.ceil(max(config.idle_sleep_s, config.election_ttl_s / 3) * 1000) + 1


def own_peek(config: ConsumerConfig) -> functools.partial[tuple[list[PointerRef], int | None]]:
    """A scanner's own :data:`Peek` (:func:`peek_shard`): it looks no further ahead than
    the scanner may sleep (:func:`longest_wait_ms`)."""
    return functools.partial(peek_shard, ahead_ms=longest_wait_ms(config))


def weighed(held: int, ref: PointerRef, weight: Callable[[PointerRef], float] | None) -> float:
    """``held`` items of a zone weighted by its tenant's weight (None: 1)."""
    return held if weight is None else held * weight(ref)
