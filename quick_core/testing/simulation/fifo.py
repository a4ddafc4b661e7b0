"""FIFO order, checked at every dequeue: the run's zone store is wrapped so that each
dequeue is compared with the commit order of the zone's never-leased FIFO items."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from quickzones.client import Quick
from quickzones.errors import CorruptRecord
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from quickzones.store.tuple_layer import fdbtuple
from quickzones.store.zonestore import ZoneStore
from quickzones.testing.simulation.world import SimWorld


class _CheckedDequeue:
    """A zone store whose every dequeue goes through ``check(real_dequeue, ...)``; every
    other operation is the wrapped store's own. Injected, so nothing in core is patched."""

    def __init__(self, inner: ZoneStore, check: Callable[..., tuple[list[Any], list[Any]]]) -> None:
        self._inner = inner
        self._check = check

    def dequeue(
        self, zone: ZoneId, max_items: int, lease_ms: int, **options: Any
    ) -> tuple[list[Any], list[Any]]:
        return self._check(self._inner.dequeue, zone, max_items, lease_ms, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FifoOrderCheck(SimWorld):
    """The dequeue check of the simulation (invariant: FIFO items leave in commit order)."""

    def _watched_zone_store(self, q: Quick) -> ZoneStore:
        """The run's zone store (a mutant's, for checker tests), with every dequeue checked
        against commit order."""
        make = self.cfg.zone_store
        inner = make(q) if make is not None else q.zones
        return cast(ZoneStore, _CheckedDequeue(inner, self._check_fifo_dequeue))

    def _check_fifo_dequeue(
        self,
        real: Callable[..., tuple[list[Any], list[Any]]],
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        **options: Any,
    ) -> tuple[list[Any], list[Any]]:
        """Check a dequeue against commit order: it hands out its never-leased FIFO
        items of one priority in commit order, and leaves no older never-leased FIFO item
        of their zone and priority behind, unless the consumer refused that one (its job
        type at its concurrency cap)."""
        refused: set[str] = set()
        accept = options.get("accept")

        def noting(item: Any) -> bool:
            ok = accept is None or bool(accept(item))
            if not ok:
                refused.add(item.item_id)
            return ok

        # A dequeue inside a caller's transaction (one-transaction and batched visits)
        # is seen as that transaction sees the zone, its own uncommitted writes included.
        view = options.get("tr")
        before = self._fifo_items(zone, view)
        items, corrupt = real(zone, max_items, lease_ms, **{**options, "accept": noting})
        taken = [i.item_id for i in items if i.item_id in before]
        last: dict[int, tuple[bytes, int]] = {}
        for item_id in taken:  # a batch hands its FIFO items out in commit order
            priority, order = before[item_id]
            if priority in last and order < last[priority]:
                self._violate("fifo_order", f"{zone}: {item_id} handed out after a newer item")
            last[priority] = order
        if taken:
            after = self._fifo_items(zone, view)
            for item_id in taken:
                priority, order = before[item_id]
                for other, (other_priority, other_order) in after.items():
                    older = other_priority == priority and other_order < order
                    if older and other not in refused:
                        self._violate(
                            "fifo_order",
                            f"{zone}: {item_id} leased while older {other} waits",
                            about=other,
                        )
        return items, corrupt

    def _fifo_items(
        self, zone: ZoneId, view: KVTransaction | None = None
    ) -> dict[str, tuple[int, tuple[bytes, int]]]:
        """Never-leased FIFO items of ``zone`` now, or as ``view`` (a transaction) sees
        them: id -> (priority, commit order). Snapshot reads: no conflict added."""
        from quickzones.store.records import decode_item

        prefix = self.keys.zone_prefix(zone)
        tr = view if view is not None else self.store.create_transaction()
        out: dict[str, tuple[int, tuple[bytes, int]]] = {}
        for key, raw in tr.get_range(*self.keys.items_range(zone), snapshot=True):
            if len(fdbtuple.unpack(key[len(prefix) :])) != 2:
                continue  # a payload chunk
            try:
                item = decode_item(key, raw)
            except CorruptRecord:
                continue
            if item.commit_order is not None:
                out[item.item_id] = (item.priority, item.commit_order)
        return out
