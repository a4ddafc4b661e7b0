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
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from quickzones.clock import Clock, ElapsedClock
from quickzones.consumer.visit_rules import Key, ZoneVisitsFailed, visit_key
from quickzones.errors import StoreLost
from quickzones.repeated_failure import RepeatedFailure, backoff

if TYPE_CHECKING:
    from quickzones.store.toplevel import PointerRef

# A zone's first retry within 0.05-0.1 s, doubling to at most 10 s between tries.
ZONE_BASE_S = 0.05
ZONE_CAP_S = 10.0
# Entries older than this past their retry time are forgotten (a pointer collected meanwhile).
FORGET_AFTER_S = 60.0



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
            self.set_aside.failed(visit_key(pointer), cause)
        if err.visited > len(err.failed):
            self.failing.clear()  # zones visited with them worked: the store works
        self.failing.append(err)

    def worked(self, ref: PointerRef) -> None:
        self.set_aside.succeeded(visit_key(ref))
        self.failing.clear()

    def store_failing(self, *, zones: int = 2) -> None:
        """Raise the last failure when ``zones`` zones or more failed, none working
        between."""
        if sum(len(err.failed) for err in self.failing) >= zones:
            raise self.failing[-1]


class ScanFailures:
    """The finished visits of a consumer's scanner, counted: a zone whose visit failed
    is set aside on its own backoff and the visits of other zones go on. After failures
    that are not one zone's (two zones or more failing, no visit working between them:
    the store refuses every commit, say), the scanner waits a backoff that grows with the
    failures in a row (at most 5 s), so such a store is not retried hot."""

    def __init__(
        self,
        set_aside: SetAside,
        visits: RepeatedFailure,
        on_lost: Callable[[StoreLost], None],
    ) -> None:
        self.set_aside = set_aside
        # Visits that raised (a full store, say): logged once per interval with a count.
        self.visits = visits
        self.on_lost = on_lost
        self._failing: set[Key | None] = set()  # None: not a zone's

    def backed_off(
        self,
        finished: dict[Future[int], list[Key]],
        stopping: threading.Event,
        emit: Callable[..., Any],
    ) -> bool:
        """Count ``finished``; after failures of the store as a whole, wait its backoff
        (or until ``stopping``). True when it waited."""
        wait_s = self.count(finished)
        if wait_s is None:
            return False
        emit("visits_backed_off", failures=self.visits.failures, wait_s=round(wait_s, 3))
        stopping.wait(wait_s)
        return True

    def count(self, finished: dict[Future[int], list[Key]]) -> float | None:
        """Count ``finished`` (each visit's future and its zones); the seconds to back
        off when the store as a whole is failing, else None."""
        for f, keys in finished.items():
            err = f.exception()
            if isinstance(err, StoreLost):
                self.on_lost(err)
                continue
            failed = (
                {visit_key(ref): e for ref, e in err.failed}
                if isinstance(err, ZoneVisitsFailed)
                else {}
            )
            worked = [key for key in keys if key not in failed] if err is None or failed else []
            for key in worked:
                self.set_aside.succeeded(key)
            if worked:
                self.visits.succeeded()
                self._failing.clear()
            if err is None:
                continue
            self.visits.failed(err)
            for key, cause in failed.items():
                self.set_aside.failed(key, cause)
            if not worked:  # a visit with zones that worked: the store works
                self._failing.update(failed or [None])
        in_a_row = self.visits.failures
        store_wide = None in self._failing or len(self._failing) > 1
        if not in_a_row or not store_wide or all(f.exception() is None for f in finished):
            return None
        return backoff(in_a_row, base_s=0.05)
