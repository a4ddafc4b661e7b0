"""The application's connection while quick writes into its open transaction."""

from __future__ import annotations

from dataclasses import dataclass

from quickzones.backends.postgres.resolver import Connection


@dataclass(slots=True)
class Joined:
    """``conn``, whose transaction holds the resolver's lock, and the store's version as
    of the lock or of quick's last write through it. Nothing else can move the version
    while the lock is held, so each transaction on ``conn`` takes it as its read version
    without asking the server again (a round trip saved per transaction)."""

    conn: Connection
    version: int
