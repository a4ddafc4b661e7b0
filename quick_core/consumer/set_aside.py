"""Zones set aside: a zone whose visit keeps failing (a record its visit cannot read, an
item past a store limit, a store error of its own) is left out of the scans on a backoff
of its own, while every other zone keeps its pickup latency (issue 40, point 4).

Before, a failing zone's error reached the scanner as any visit's did and the whole
consumer backed off: three zones batched with a failing one never ran, and a trickle
tenant's median pickup went from 3-5 ms to 115-1,585 ms. Now each zone named by a
:class:`~quickzones.consumer.visit.ZoneVisitsFailed` waits here, doubling with its
failures in a row (at most ``cap_s``), and a visit of it that succeeds clears it. The
scanner's own backoff is left for failures of the store as a whole (its scanner).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quickzones.clock import Clock, ElapsedClock
from quickzones.repeated_failure import backoff

if TYPE_CHECKING:
    from quickzones.consumer.visit import ZoneVisitsFailed
    from quickzones.store.toplevel import PointerRef

# A zone's first retry within 0.05-0.1 s, doubling to at most 10 s between tries.
ZONE_BASE_S = 0.05
ZONE_CAP_S = 10.0
# Entries older than this past their retry time are forgotten (a pointer collected meanwhile).
FORGET_AFTER_S = 60.0

Key = tuple[str, int, str]  # a pointer: cluster, shard, pointer id


def elapsed(clock: Clock) -> Callable[[], float]:
    """Elapsed time by ``clock`` where it measures it (a simulated clock), else the
    process's: no step of the wall clock stretches a zone's backoff."""
    return clock.monotonic if isinstance(clock, ElapsedClock) else time.monotonic


class SetAside:
    """The pointers set aside after failed visits, by key. Thread-safe."""

    def __init__(
        self,
        emit: Callable[..., Any],
        *,
        base_s: float = ZONE_BASE_S,
        cap_s: float = ZONE_CAP_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emit = emit
        self.base_s = base_s
        self.cap_s = cap_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._held: dict[Key, tuple[int, float]] = {}  # failures in a row, until

    def failed(self, key: Key, err: BaseException) -> float:
        """Set ``key`` aside after a failed visit; returns for how many seconds."""
        now = self._monotonic()
        with self._lock:
            failures = self._held.get(key, (0, 0.0))[0] + 1
            # Equal jitter: at least half the step, so a failing zone is never retried
            # hot, and zones failing together do not retry together.
            wait_s = backoff(failures - 1, base_s=self.base_s, cap_s=self.cap_s, least=0.5)
            self._held[key] = (failures, now + wait_s)
            if len(self._held) > 1024:
                self._forget(now)
        self.emit(
            "zone_set_aside",
            pointer_id=key[2],
            failures=failures,
            retry_in_s=round(wait_s, 3),
            error=f"{type(err).__name__}: {err}",
        )
        return wait_s

    def succeeded(self, key: Key) -> None:
        """A visit of ``key`` worked: its next failure starts a new backoff."""
        if self._held:  # the common case, without the lock
            with self._lock:
                self._held.pop(key, None)

    def holds(self, key: Key) -> bool:
        """Whether ``key`` is set aside now (the scanner passes over it)."""
        held = self._held.get(key)
        return held is not None and self._monotonic() < held[1]

    def failures(self, key: Key) -> int:
        """``key``'s failed visits in a row (0: none)."""
        held = self._held.get(key)
        return 0 if held is None else held[0]

    def _forget(self, now: float) -> None:
        for key in [k for k, (_, until) in self._held.items() if until < now - FORGET_AFTER_S]:
            del self._held[key]


class VisitFailures:
    """The failed zone visits of one pull lease call or one ``run_until_idle`` round
    (each raised :class:`~quickzones.consumer.visit.ZoneVisitsFailed`): each zone that
    failed on its own is set aside and the caller goes on with the others. Zones failing
    with none working between is the store failing, as a consumer's scanner has it
    (it backs off then): :meth:`store_failing` raises the last error."""

    def __init__(self, set_aside: SetAside) -> None:
        self.set_aside = set_aside
        self.failing: list[ZoneVisitsFailed] = []  # since a zone last worked

    def failed(self, err: ZoneVisitsFailed) -> None:
        for pointer, cause in err.failed:
            self.set_aside.failed((pointer.cluster, pointer.shard, pointer.pointer_id), cause)
        if err.visited > len(err.failed):
            self.failing.clear()  # zones visited with them worked: the store works
        self.failing.append(err)

    def worked(self, ref: PointerRef) -> None:
        self.set_aside.succeeded((ref.cluster, ref.shard, ref.pointer_id))
        self.failing.clear()

    def store_failing(self, *, zones: int = 2) -> None:
        """Raise the last failure when ``zones`` zones or more failed, none working
        between."""
        if sum(len(err.failed) for err in self.failing) >= zones:
            raise self.failing[-1]
