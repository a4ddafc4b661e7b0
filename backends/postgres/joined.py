"""The application's connection while quick writes into its open transaction."""

from __future__ import annotations

from dataclasses import dataclass

from quickzones.backends.postgres.resolver import Connection


@dataclass(slots=True)
class Joined:
    """``conn``, whose open transaction quick writes into, and what quick's first read
    through it learned: the transaction's id (None: not read yet) and whether it runs at
    READ COMMITTED (a conflict can then be retried inside it)."""

    conn: Connection
    xid: str | None = None
    read_committed: bool = True
    # A conflict at REPEATABLE READ or SERIALIZABLE: the application's snapshot is older
    # than a quick commit it had to see; its transaction must run again.
    stale_snapshot: bool = False
