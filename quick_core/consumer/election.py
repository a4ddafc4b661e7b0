"""The election seam: who runs the one in-order (sequential) scanner of a top-level queue.

The paper keeps one scanner per top-level queue in order so no pointer starves; it is
elected by a lease on a shared memory object. Implementations:
:class:`~quickzones.consumer.store_election.StoreElection` (a record in the queue's own
store, the default and the authority, see :mod:`quickzones.consumer.scanner_election`),
``quickzones.adapters.redis.RedisElection`` and
``quickzones.adapters.memcached.MemcachedElection`` (in front of it), and
:class:`LocalElection` (one process's table: tests and the simulation).
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass
from typing import Protocol

from quickzones.clock import Clock, SystemClock
from quickzones.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Leadership:
    """A held lease: ``term`` grows with every new holder (a fencing token)."""

    name: str
    holder: str
    term: int
    expires_at: float


class Election(Protocol):
    """A renewable lease with a TTL on a named object.

    ``try_acquire`` succeeds only if the lease is free or expired; ``renew`` and ``release``
    succeed only for the current holder (compare-and-set), so a deposed holder learns it
    lost the lease from ``renew`` returning None.
    """

    def try_acquire(self, name: str, holder: str, ttl: float) -> Leadership | None: ...

    def renew(self, lease: Leadership, ttl: float) -> Leadership | None: ...

    def release(self, lease: Leadership) -> bool: ...

    def close(self) -> None: ...


def new_candidate_id() -> str:
    """A random identity for one election candidate."""
    return secrets.token_hex(8)


class LocalElection:
    """Process-local election: candidates in one process share a lease table."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._held: dict[str, Leadership] = {}
        self._terms: dict[str, int] = {}

    def try_acquire(self, name: str, holder: str, ttl: float) -> Leadership | None:
        with self._lock:
            now = self._clock.now()
            cur = self._held.get(name)
            if cur is not None and cur.expires_at > now and cur.holder != holder:
                return None
            if cur is not None and cur.holder == holder and cur.expires_at > now:
                lease = Leadership(name, holder, cur.term, now + ttl)
            else:
                term = self._terms.get(name, 0) + 1
                self._terms[name] = term
                lease = Leadership(name, holder, term, now + ttl)
            self._held[name] = lease
            return lease

    def renew(self, lease: Leadership, ttl: float) -> Leadership | None:
        with self._lock:
            now = self._clock.now()
            cur = self._held.get(lease.name)
            if cur is None or cur.holder != lease.holder or cur.term != lease.term:
                return None
            if cur.expires_at <= now:
                return None
            renewed = Leadership(lease.name, lease.holder, lease.term, now + ttl)
            self._held[lease.name] = renewed
            return renewed

    def release(self, lease: Leadership) -> bool:
        with self._lock:
            cur = self._held.get(lease.name)
            if cur is None or cur.holder != lease.holder or cur.term != lease.term:
                return False
            del self._held[lease.name]
            return True

    def close(self) -> None:
        pass


def ttl_ms(ttl: float) -> int:
    """An election's ``ttl`` (seconds) in whole ms, rounded up; bad values refused."""
    if not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
        raise InvalidArgument("ttl", ttl, "must be a finite number of seconds > 0")
    return max(1, math.ceil(ttl * 1000))


def check_ids(name: str, holder: str) -> None:
    """An election's lease ``name`` and ``holder`` must be non-empty strings."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("name", name, "must be a non-empty string")
    if not isinstance(holder, str) or not holder:
        raise InvalidArgument("holder", holder, "must be a non-empty string")
