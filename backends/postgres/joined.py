"""The application's connection while quick writes into its open transaction."""

from __future__ import annotations

from dataclasses import dataclass

from quickzones.backends.postgres.resolver import Connection


@dataclass(slots=True)
class Joined:
    """``conn``, whose transaction holds the resolver's lock once quick's first round trip
    through it took it, and the store's version as of the lock or of quick's last write
    through it (None: not locked yet). Nothing else can move the version while the lock
    is held, so each transaction on ``conn`` takes it as its read version without asking
    the server again (a round trip saved per transaction)."""

    conn: Connection
    version: int | None = None
    # The lock was refused for a snapshot older than the last quick commit (REPEATABLE
    # READ, SERIALIZABLE): the application's transaction failed and must run again.
    stale_snapshot: bool = False
