"""Small sets of records that every consumer reads before its visits: pauses
(:mod:`.pauses`), tenant weights (:mod:`.weights`) and per-tenant limits
(:mod:`.tenant_limits`). Each kind lives in the store's meta range, is read whole by one
snapshot range read, and is kept by each reader for ``refresh_s``, so a visit costs no
read and a change reaches every consumer within about that long; the process that makes a
change sees it at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

from quickzones.clock import Clock
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run

R = TypeVar("R")  # one record as listed
S = TypeVar("S")  # the set a reader consults


class CachedRecordSet(Generic[R, S]):
    """The cache and the removal every such kind shares; a kind lists its records
    (:meth:`list`) and builds the set readers consult from them (:meth:`_set_of`)."""

    def __init__(self, kv: KVStore, keys: KeySpace, clock: Clock, refresh_s: float) -> None:
        self.kv = kv
        self.keys = keys
        self.clock = clock
        self.refresh_s = refresh_s
        self._cached: tuple[float, S] | None = None

    def list(self) -> list[R]:
        raise NotImplementedError

    def _set_of(self, records: Sequence[R]) -> S:
        raise NotImplementedError

    def _drop(self, key: bytes) -> bool:
        """Remove the record at ``key``; False when there was none."""

        def drop(tr: KVTransaction) -> bool:
            if tr.get(key) is None:
                return False
            tr.clear(key)
            return True

        dropped = run(self.kv, drop)
        self._cached = None  # this process sees its own change at once
        return dropped

    @property
    def last(self) -> S | None:
        """The set last read, however old (None before the first read): what a reader
        goes on with while the store cannot be read."""
        return None if self._cached is None else self._cached[1]

    def current(self) -> S:
        """The set in force, read at most once each ``refresh_s``: a visit's view."""
        now = self.clock.now()
        cached = self._cached
        if cached is not None and now - cached[0] < self.refresh_s:
            return cached[1]
        found = self._set_of(self.list())
        self._cached = (now, found)
        return found
