"""Multi-version key storage for the simulator: every key keeps its recent versions.

Not thread-safe; the store calls it under its one lock.
"""

from __future__ import annotations

import bisect

from quickzones.backends.txnbuffer import KeyValue, ResolvedWrites

# (commit version, value or None for a clear), oldest first.
History = list[tuple[int, bytes | None]]


def _value_at(history: History, version: int) -> bytes | None:
    for v, value in reversed(history):
        if v <= version:
            return value
    return None


class VersionedMap:
    """Sorted keys with per-key version histories.

    ``horizon`` is a version every live reader is at or after; versions hidden behind a
    newer one at or before it can never be read again and are dropped.
    """

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._history: dict[bytes, History] = {}
        self.horizon = 0
        self._writes_since_sweep = 0
        self._dead_skipped = 0  # cleared keys that scans stepped over since the last sweep
        self._swept_at = -1  # horizon of the last sweep: sweeping again before it moves is futile

    def get(self, key: bytes, version: int) -> bytes | None:
        history = self._history.get(key)
        return None if history is None else _value_at(history, version)

    def latest(self, key: bytes) -> bytes | None:
        history = self._history.get(key)
        return None if history is None else history[-1][1]

    def scan(
        self, begin: bytes, end: bytes, version: int, limit: int, reverse: bool
    ) -> list[KeyValue]:
        out: list[KeyValue] = []
        keys, history = self._keys, self._history
        if reverse:
            i = bisect.bisect_left(keys, end) - 1
            while i >= 0 and keys[i] >= begin:
                value = _value_at(history[keys[i]], version)
                if value is not None:
                    out.append((keys[i], value))
                    if len(out) == limit:
                        break
                else:
                    self._dead_skipped += 1
                i -= 1
        else:
            i = bisect.bisect_left(keys, begin)
            n = len(keys)
            while i < n and keys[i] < end:
                value = _value_at(history[keys[i]], version)
                if value is not None:
                    out.append((keys[i], value))
                    if len(out) == limit:
                        break
                else:
                    self._dead_skipped += 1
                i += 1
        if self._dead_skipped > max(4096, len(keys) // 8) and self.horizon > self._swept_at:
            self.sweep()  # only versions no live reader can see go; safe mid-read
        return out

    def apply(self, writes: ResolvedWrites, version: int) -> None:
        for begin, end in writes.clears:
            lo = bisect.bisect_left(self._keys, begin)
            hi = bisect.bisect_left(self._keys, end)
            for key in self._keys[lo:hi]:
                self._write(key, None, version)
        for key, value in writes.sets:
            self._write(key, value, version)
        for key in writes.deletes:
            self._write(key, None, version)
        self._writes_since_sweep += 1
        # Sweep dead tombstones now and then; amortised O(1) per commit. Also sooner when
        # reads keep stepping over them (like FDB compacting away cleared ranges), so a
        # million collected tenants do not slow every later scan.
        if self.horizon > self._swept_at and (
            self._writes_since_sweep > max(1024, len(self._keys) // 4)
            or self._dead_skipped > max(4096, len(self._keys) // 8)
        ):
            self.sweep()

    def _write(self, key: bytes, value: bytes | None, version: int) -> None:
        history = self._history.get(key)
        if history is None:
            if value is None:
                return
            bisect.insort(self._keys, key)
            self._history[key] = [(version, value)]
            return
        if value is None and history[-1][1] is None:
            return  # already cleared; a second tombstone changes nothing for any reader
        history.append((version, value))
        while len(history) > 1 and history[1][0] <= self.horizon:
            del history[0]

    def sweep(self) -> None:
        """Drop unreadable versions and keys whose only readable state is a clear."""
        self._writes_since_sweep = 0
        self._dead_skipped = 0
        horizon = self._swept_at = self.horizon
        live: list[bytes] = []
        for key in self._keys:
            history = self._history[key]
            while len(history) > 1 and history[1][0] <= horizon:
                del history[0]
            if len(history) == 1 and history[0][1] is None and history[0][0] <= horizon:
                del self._history[key]
            else:
                live.append(key)
        self._keys = live

    def items(self) -> dict[bytes, bytes]:
        """Newest committed value of every key, in key order."""
        out: dict[bytes, bytes] = {}
        for key in self._keys:
            value = self._history[key][-1][1]
            if value is not None:
                out[key] = value
        return out
