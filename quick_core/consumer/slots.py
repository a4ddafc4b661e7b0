"""Pool-wide concurrency slots (beyond the paper: per-app and per-job-type caps across all
consumers), held by a consumer in the shared ``Limits`` store.

A Manager (Algorithm 2) takes app slots for the items it dequeues, a Worker (Algorithm 3)
takes a job type's slot while its handler runs, and the lease extender keeps the held ones
from lapsing. When a running item's slot is released, the watchers are told
(:mod:`quickzones.consumer.cap_wake`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from quickzones.errors import StorageError
from quickzones.store.limits import Limits, SlotName


class Slots:
    """This consumer's share of the pool-wide concurrency caps."""

    def __init__(
        self,
        limits: Limits | None,
        owner: str,
        item_lease_s: float,
        lock: threading.Lock,
        emit: Callable[..., Any],
    ) -> None:
        self.limits = limits
        self.emit = emit
        self.owner = owner
        self.item_lease_s = item_lease_s
        self.lock = lock
        self.held: Counter[tuple[str, SlotName]] = Counter()
        # Each change to this owner's count in the store and to ``held`` is made under it,
        # so a refresh (which writes ``held`` as the count) never lands between an acquire's
        # write and its update of ``held``: it would write the count before the acquire,
        # and another consumer could take the slot this one holds (3 running under a cap
        # of 2, seen under load).
        self._sync = threading.Lock()
        # Told when a running item's slot is released (consumer.cap_wake).
        self.watchers: list[Callable[[str, SlotName], None]] = []

    def ttl_ms(self) -> int:
        return int(max(10.0, self.item_lease_s) * 1000)

    def acquire(
        self, scope: str, name: SlotName, wanted: int, cap: int, *, whole: bool = False
    ) -> int:
        assert self.limits is not None
        with self._sync:
            got = self.limits.acquire_slots(
                scope, name, self.owner, wanted, cap, self.ttl_ms(), whole=whole
            )
            if got:
                with self.lock:
                    self.held[(scope, name)] += got
        return got

    def release(self, scope: str, name: SlotName, n: int) -> None:
        if self.limits is None or n <= 0:
            return
        with self._sync:
            with self.lock:
                self.held[(scope, name)] -= n
            try:
                self.limits.release_slots(scope, name, self.owner, n, self.ttl_ms())
            except StorageError:
                pass  # the slot record lapses after its TTL

    def ended(self, scope: str, name: SlotName) -> None:
        """Release the slot of an item whose handler ended, and tell the watchers: a zone
        held back at that cap can be visited again."""
        self.release(scope, name, 1)
        for watcher in self.watchers:
            watcher(scope, name)

    def refresh_once(self) -> None:
        """Keep this consumer's pool-wide concurrency slots from lapsing."""
        if self.limits is None:
            return
        with self.lock:
            names = [k for k, n in self.held.items() if n > 0]
        for scope, name in names:
            with self._sync:  # the count as it is now, not as it was before an acquire
                with self.lock:
                    n = self.held[(scope, name)]
                if n <= 0:
                    continue
                try:
                    self.limits.refresh_slots(scope, name, self.owner, n, self.ttl_ms())
                except StorageError as err:
                    self.emit("limits_error", error=str(err))
