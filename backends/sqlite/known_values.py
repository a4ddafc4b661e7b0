"""What this store's own commits left in the keys read after them, so a commit that
follows with nothing in between need not read those keys again.

A commit may ask for keys to be read once its writes are in (``kv.read_after_commit``:
the enqueue's part two looks at the zone's pointer index entry and record). The resolver
reads them under the write lock, just before COMMIT. Each commit's version is new and
every writer of the file bumps it (quick_meta), so a snapshot of this store's last commit
version sees exactly what that commit left: the values it read after its writes, and
those it kept from earlier commits of its own that it did not write since. A commit that
took the write lock inside such a snapshot (nothing committed since it began) and writes
none of the keys it asks for finds them here instead of in a statement of their own: an
enqueue into a zone it enqueued into before, while this store alone writes.

Any other commit in between (another process or store object, the application's own
connection, a commit of this store that did not hold the lock since its snapshot, a range
clear or versionstamped key whose keys are not known here) makes the next commit read
them again and start over. Commits run one at a time under the store's write lock; so do
these calls.
"""

from __future__ import annotations

from quickzones.backends.txnbuffer import CommitRequest

# Keys kept at most (two a zone enqueued into); all dropped when full.
KEEP = 4096


class KnownValues:
    """Values of keys as of :attr:`version`, the version of this store's last commit."""

    def __init__(self, keep: int = KEEP) -> None:
        self.version: int | None = None
        self._values: dict[bytes, bytes | None] = {}
        self._keep = keep

    def lookup(self, request: CommitRequest, in_snapshot: bool) -> dict[bytes, bytes | None] | None:
        """The values of ``request.read_after`` right after its commit, if known here:
        its snapshot is of the kept version and it held the write lock since
        (``in_snapshot``), and it writes none of them. None when any is not known."""
        if not in_snapshot or request.read_version != self.version:
            return None
        written = request.point_keys()
        if written is None:
            return None
        values = self._values
        found: dict[bytes, bytes | None] = {}
        for key in request.read_after:
            if key in written or key not in values:
                return None
            found[key] = values[key]
        return found

    def committed(
        self,
        request: CommitRequest,
        version: int,
        *,
        in_snapshot: bool,
        read: dict[bytes, bytes | None] | None,
    ) -> None:
        """``request`` committed at ``version``; ``read``: the values of its keys read
        after its writes (or found here). What it wrote is forgotten; what came between
        its snapshot and the kept version, if anything could have, forgets everything."""
        written = request.point_keys()
        if not in_snapshot or request.read_version != self.version or written is None:
            self._values = {}
        else:
            for key in written:
                self._values.pop(key, None)
        if read:
            if len(self._values) + len(read) > self._keep:
                self._values = {}
            self._values.update(read)
        self.version = version

    def forget(self) -> None:
        """A commit failed, or its COMMIT's outcome is unknown: nothing is known."""
        self.version = None
        self._values = {}
