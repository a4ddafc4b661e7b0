"""What this store read right after its own commits, with the snapshot it was read in, so
that the next enqueue into the same zone sends no reads of its own (issue 42: one round
trip an enqueue).

FoundationDB's meaning lets a transaction read at an older read version: its commit's
check fails it if a commit its reads did not see wrote into what it read. Here a read
version is a snapshot (``pg_snapshot``), and ``quick_commit3`` checks a transaction's
read ranges against the ``quick_log`` rows of every commit that snapshot did not see,
however old it is, as long as those rows are still there. So part one's reads of an
enqueue (the layout and the zone's pointer index entry) can be answered from values read
in an earlier snapshot, and its commit sent at once with that snapshot: if anything it
read changed since, the check fails it and it runs again, reading afresh.

Where the values come from: a commit whose first read was a few keys at once (an
enqueue's) reads those keys again after its COMMIT, with the statement's snapshot and
the last commit version, in the same round trip as part two's look at the pointer
(``resolver.apply``'s ``keep``). Each such read is a :class:`Seen`: one snapshot and the
values of its keys in it.

How old they may be: ``quick_log`` rows go once a snapshot taken over 6 s ago saw them
(``resolver.prune``), and a commit whose read version is past the 5 s lifetime is refused
before it is sent (``TRANSACTION_TOO_OLD``). A snapshot kept here is used only while it
is younger than :data:`FRESH_S`, well inside the lifetime, so the rows it needs are still
there and the commit is not refused for its age; its time is the client's clock before
the round trip that took it, as a transaction's read time is.

And how many commits behind: the check reads every ``quick_log`` row of a commit the
snapshot did not see and compares its write ranges with the reads, about 10 us a row on
the server, while the commit holds its locks. A zone enqueued into again after a second
of other enqueues (a small tenant's usual enqueue) had its kept snapshot hundreds of
commits old: 300 rows, 3-4 ms of the server's time in each such commit, against 0.3 ms
for a round trip that reads afresh. So a snapshot is used only while it is at most
:data:`MOST_BEHIND` commit versions older than the newest this store has seen (its own
commits', and those its reads and other kept snapshots saw).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

# Keys kept at most (about four a zone enqueued into); all dropped when full.
KEEP = 4096
# How long a kept snapshot answers reads: under half the 5 s lifetime.
FRESH_S = 2.0
# A commit keeps what it read first only when that was at most this many keys.
MOST_KEYS = 4
# How many commit versions a kept snapshot may be behind the newest this store has seen:
# as many log rows for the commit's check, at about the cost of a round trip's read.
MOST_BEHIND = 32


@dataclass(slots=True)
class Seen:
    """Values of ``keys`` in one snapshot (None: absent), read after a commit."""

    snapshot: str
    version: int
    at: float  # the clock before the round trip that read them
    values: dict[bytes, bytes | None] = field(default_factory=dict)


class KnownReads:
    """The newest :class:`Seen` that holds each key; any thread may call."""

    def __init__(
        self, keep: int = KEEP, fresh_s: float = FRESH_S, most_behind: int = MOST_BEHIND
    ) -> None:
        self._by_key: dict[bytes, Seen] = {}
        self._keep = keep
        self._fresh_s = fresh_s
        self._most_behind = most_behind
        self._lock = threading.Lock()
        # The newest commit version this store has seen (a benign race: a lower value
        # written last only lets an older snapshot be used, which the check still checks).
        self.newest = 0

    def noted(self, version: int) -> None:
        """A commit of ``version`` was made or seen (this store's, or one a read saw)."""
        if version > self.newest:
            self.newest = version

    def lookup(self, keys: Sequence[bytes], now: float) -> Seen | None:
        """A snapshot younger than :data:`FRESH_S` and at most :data:`MOST_BEHIND`
        commits behind the newest seen, in which every one of ``keys`` was read, or
        None."""
        by_key = self._by_key
        oldest = self.newest - self._most_behind
        for key in keys:
            seen = by_key.get(key)
            if seen is None or now - seen.at > self._fresh_s or seen.version < oldest:
                continue
            values = seen.values
            if all(k in values for k in keys):
                return seen
        return None

    def learned(self, seen: Seen) -> None:
        self.noted(seen.version)
        with self._lock:
            by_key = self._by_key
            if len(by_key) + len(seen.values) > self._keep:
                by_key.clear()
            for key in seen.values:
                by_key[key] = seen

    def forget(self, seen: Seen) -> None:
        """``seen`` is stale (a commit that read from it failed its check): its keys are
        read afresh until a later commit reads them again."""
        with self._lock:
            by_key = self._by_key
            for key in seen.values:
                if by_key.get(key) is seen:
                    del by_key[key]
