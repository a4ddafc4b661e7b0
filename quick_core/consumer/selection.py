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

import math
import random
from collections.abc import Callable, Sequence

from quickzones.consumer.config import ConsumerConfig
from quickzones.store.toplevel import PointerRef


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

    def add(self, peeked: Sequence[PointerRef], in_order: bool) -> None:
        """One shard's vested pointers, oldest first."""
        if in_order:
            self.ordered.extend(peeked)
            return
        cfg = self.config
        room = cfg.selection_max - len(self.sampled)
        k = min(room, len(peeked), max(1, math.ceil(cfg.selection_frac * len(peeked))))
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
