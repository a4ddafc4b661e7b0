"""A KV store that counts the keys read (given to Quick at construction), and a fast way
to many dead letters: what the paged-list tests measure a page's cost with."""

from __future__ import annotations

from typing import Any

from quickzones.client import Quick
from quickzones.store.kv import KVStore, KVTransaction
from quickzones.store.records import WorkItem, ZoneId, encode_item


class _CountingTransaction:
    def __init__(self, tr: KVTransaction, store: CountingKV) -> None:
        self._tr = tr
        self._store = store

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        value = self._tr.get(key, snapshot=snapshot)
        self._store.keys_read += value is not None
        self._store.reads += 1
        return value

    def get_range(self, *args: Any, **kwargs: Any) -> list[tuple[bytes, bytes]]:
        rows = self._tr.get_range(*args, **kwargs)
        self._store.keys_read += len(rows)
        self._store.reads += 1
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)


class CountingKV:
    """A KV store that counts the keys its transactions read, and the reads (a get or a
    range read, found or not) that read them (given to Quick at construction)."""

    def __init__(self, store: KVStore) -> None:
        self._store = store
        self.keys_read = 0
        self.reads = 0
        self.transactions = 0

    def create_transaction(self) -> KVTransaction:
        self.transactions += 1
        return _CountingTransaction(self._store.create_transaction(), self)  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def bury(q: Quick, app: str, tenant: str, ids: list[str], job_type: str = "j") -> None:
    """Write dead letters directly, a thousand a transaction (a fast way to a big store)."""
    zone = ZoneId(app, tenant)
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]

        def write(tr: KVTransaction, chunk: list[str] = chunk) -> None:
            for item_id in chunk:
                item = WorkItem(item_id, job_type, b"{}", 0, 0, 0, content_type="json")
                q.zones._dead_letter_raw(
                    tr, zone, item_id, encode_item(item), "buried", 1, job_type=job_type
                )

        q.transact(write)
