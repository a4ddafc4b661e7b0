"""``StoreElection``: the scanner election as a lease record in the queue's own KV store.

No extra service: the record lives beside the top-level queue it elects a scanner for,
under its own key range::

    (root, "m", "election", name) -> fdb.tuple (version, term, expires_ms, holder)

``expires_ms`` is in the store's time, the clock every process of the store reads vesting
times through (:class:`~quickzones.store.steady_clock.SteadyClock` by default), so a lease
ends for every candidate when an item lease stamped at the same moment would.

Each operation is one transaction that reads the record with a conflicting read and
writes it, so two candidates that both see a free or expired lease can never both win:
the second to commit conflicts, runs again, and finds the lease held. A released lease
keeps its record (``expires_ms`` 0), so terms keep growing by one per holder: ``term`` is
a fencing token, and ``quick stats`` shows who held the lease last.

The holder's own ``expires_at`` is the time read *before* its transaction plus the TTL,
never later than what it stored, so a holder that stops at ``expires_at`` never overlaps a
successor whose clock agrees with its own (as item leases already assume).
"""

from __future__ import annotations

from dataclasses import dataclass

from quickzones.clock import Clock, now_ms
from quickzones.consumer.election import Leadership
from quickzones.consumer.election import check_ids as _check_ids
from quickzones.consumer.election import ttl_ms as _ttl_ms
from quickzones.store.keys import KeySpace
from quickzones.store.kv import OWN_STORE, KVStore, KVTransaction, transactional
from quickzones.store.tuple_layer import fdbtuple

_VERSION = 1


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A stored scanner lease: who holds (or last held) it, its term, when it ends."""

    name: str
    holder: str
    term: int
    expires_ms: int

    def held_at(self, at_ms: int) -> bool:
        return self.expires_ms > at_ms


def encode_lease(term: int, expires_ms: int, holder: str) -> bytes:
    packed: bytes = fdbtuple.pack((_VERSION, term, expires_ms, holder))
    return packed


def decode_lease(name: str, raw: bytes | None) -> LeaseRecord | None:
    """The stored lease, or None when absent or not written by this version (treated as
    free: a lease is only ever a few seconds' worth of state)."""
    if raw is None:
        return None
    try:
        parts = fdbtuple.unpack(raw)
    except (ValueError, TypeError, IndexError):
        return None
    if len(parts) != 4 or parts[0] != _VERSION:
        return None
    _, term, expires_ms, holder = parts
    if not (isinstance(term, int) and isinstance(expires_ms, int) and isinstance(holder, str)):
        return None
    return LeaseRecord(name, holder, term, expires_ms)


class StoreElection:
    """An :class:`~quickzones.consumer.election.Election` kept in a KV store (the default).

    Thread-safe (each call is its own transaction). Storage errors propagate as
    :class:`~quickzones.errors.StorageError`, as from the other elections.
    """

    def __init__(self, kv: KVStore, keys: KeySpace, clock: Clock) -> None:
        self.kv = kv
        self.keys = keys
        self.clock = clock

    def lease_key(self, name: str) -> bytes:
        # (root, "m", "election", name)
        return self.keys.meta_key("election", name)

    @transactional
    def read(self, name: str, *, tr: KVTransaction = OWN_STORE) -> LeaseRecord | None:
        """The stored lease of ``name`` (held or not); a snapshot read, conflicts with
        nothing (``quick stats``)."""
        return decode_lease(name, tr.get(self.lease_key(name), snapshot=True))

    @transactional
    def try_acquire(
        self, name: str, holder: str, ttl: float, *, tr: KVTransaction = OWN_STORE
    ) -> Leadership | None:
        """Take the lease if free or expired (next term), extend it if ``holder`` has it
        (same term: a retry after an unknown commit result finds its own lease); None
        while someone else holds it. Conflicts with every other write of the lease."""
        _check_ids(name, holder)
        ttl_ms = _ttl_ms(ttl)
        start_ms = now_ms(self.clock)
        key = self.lease_key(name)
        cur = decode_lease(name, tr.get(key))
        if cur is not None and cur.held_at(start_ms):
            if cur.holder != holder:
                return None
            term = cur.term
        else:
            term = (cur.term if cur is not None else 0) + 1
        return self._write(tr, key, name, holder, term, start_ms + ttl_ms)

    @transactional
    def renew(
        self, lease: Leadership, ttl: float, *, tr: KVTransaction = OWN_STORE
    ) -> Leadership | None:
        """Extend ``lease`` to ``ttl`` from now; None if it expired or is no longer the
        stored one (a successor took it)."""
        ttl_ms = _ttl_ms(ttl)
        start_ms = now_ms(self.clock)
        key = self.lease_key(lease.name)
        cur = decode_lease(lease.name, tr.get(key))
        if cur is None or not self._is(cur, lease) or not cur.held_at(start_ms):
            return None
        return self._write(tr, key, lease.name, lease.holder, lease.term, start_ms + ttl_ms)

    @transactional
    def release(self, lease: Leadership, *, tr: KVTransaction = OWN_STORE) -> bool:
        """End ``lease`` now, keeping its term for the next holder; False if it was no
        longer held (expired, released, or a successor's)."""
        key = self.lease_key(lease.name)
        cur = decode_lease(lease.name, tr.get(key))
        if cur is None or not self._is(cur, lease) or not cur.held_at(now_ms(self.clock)):
            return False
        tr.set(key, encode_lease(lease.term, 0, lease.holder))
        return True

    def close(self) -> None:
        """Nothing to close: the store belongs to its :class:`~quickzones.client.Quick`."""

    @staticmethod
    def _is(cur: LeaseRecord | None, lease: Leadership) -> bool:
        return cur is not None and cur.holder == lease.holder and cur.term == lease.term

    @staticmethod
    def _write(
        tr: KVTransaction, key: bytes, name: str, holder: str, term: int, expires_ms: int
    ) -> Leadership:
        tr.set(key, encode_lease(term, expires_ms, holder))
        return Leadership(name, holder, term, expires_ms / 1000)
