"""What one visit's transaction may carry: a byte and a key budget, well below the store's
limits, whatever the payload sizes (issue 40, point 3).

A lease rewrites an item's record, and a record keeps a payload of up to 64 KB inline
(:data:`~quickzones.store.zones.items.INLINE_PAYLOAD_LIMIT`), so the bytes a visit writes
grow with its items' payloads: 16 workers' free capacity (256 items) of 60 KB payloads
was about 15 MB in one transaction, past the 10 MB every KV backend allows
(:data:`~quickzones.store.kv.TRANSACTION_SIZE_LIMIT`: FoundationDB's own, enforced the
same by the SQLite, PostgreSQL and memory stores), so every visit was refused, and the
next one was the same. A larger chunked payload is read whole by its visit (only its
header is rewritten), which costs time against the 5 s transaction lifetime instead.

A dequeue charges each item it leases or dead-letters what that costs the transaction
(the record read and written again, its chunks read, its keys) and stops once the next
item would pass the budget; the first item of a transaction is always taken, so a single
item larger than the budget still runs. The items left are still vested: the zone's
pointer is requeued at once and the next visit takes them. One budget spans a batched
visit's zones (one transaction).
"""

from __future__ import annotations

from dataclasses import dataclass

# About 1 MB a visit: a tenth of the store's 10 MB, so conflict ranges, the pointer's
# writes and a batched visit's other zones never bring a visit near the limit, and small
# enough to read in well under the 5 s lifetime.
VISIT_BYTES = 1_000_000
# Keys a visit touches, at most: each leased item reads its record (and chunks) and writes
# its record and two order-index keys. 2,000 is about 500 items a transaction.
VISIT_KEYS = 2_000
# What an item's keys and conflict ranges add to its record's bytes, by estimate: the
# order-index entry cleared and set, the record's key, each counted with its range.
ITEM_KEY_BYTES = 4 * 128
ITEM_KEYS = 4


@dataclass(slots=True)
class TransactionBudget:
    """The bytes and keys left to one transaction's dequeues. Not thread-safe: one
    transaction is one thread's."""

    max_bytes: int = VISIT_BYTES
    max_keys: int = VISIT_KEYS
    spent_bytes: int = 0
    spent_keys: int = 0
    charged: int = 0  # items charged: leased or dead-lettered (written)
    reached: bool = False  # an item was left for the next visit

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_keys < 1:
            raise ValueError("a transaction budget needs at least 1 byte and 1 key")

    def admit(self, raw_bytes: int, chunk_bytes: int = 0, chunks: int = 0) -> bool:
        """Charge an item whose record is ``raw_bytes`` long (read, then rewritten by its
        lease), with ``chunk_bytes`` of payload chunks in ``chunks`` keys (read only);
        False, charging nothing, when it does not fit what is left and something was
        charged already (a transaction always takes its first item)."""
        cost = 2 * raw_bytes + chunk_bytes + ITEM_KEY_BYTES
        keys = ITEM_KEYS + chunks
        over = self.spent_bytes + cost > self.max_bytes or self.spent_keys + keys > self.max_keys
        if over and self.charged:
            self.reached = True
            return False
        self.spent_bytes += cost
        self.spent_keys += keys
        self.charged += 1
        return True

    def items_to_read(self, first: int) -> int:
        """How many more records a dequeue reads at once: ``first`` while nothing is
        charged, then about as many as fit at the average cost so far, and one more
        (which tells whether the budget is reached)."""
        if not self.charged:
            return first
        average = max(1, self.spent_bytes // self.charged)
        by_bytes = max(0, self.max_bytes - self.spent_bytes) // average
        by_keys = max(0, self.max_keys - self.spent_keys) // ITEM_KEYS
        return min(by_bytes, by_keys) + 1

    def mark(self) -> tuple[int, int, int, bool]:
        """Where the budget stands (for :meth:`rewind`)."""
        return self.spent_bytes, self.spent_keys, self.charged, self.reached

    def rewind(self, mark: tuple[int, int, int, bool]) -> None:
        """Back to ``mark``: a dequeue's own transaction retried charges its items again."""
        self.spent_bytes, self.spent_keys, self.charged, self.reached = mark
