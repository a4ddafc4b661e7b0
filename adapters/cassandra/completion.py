"""Completing items of Cassandra zones: delete for the lease's holder, one conditional
batch per zone for many."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quickzones.adapters.cassandra.driver import CassandraError
from quickzones.adapters.cassandra.plans import Plan
from quickzones.adapters.cassandra.reads import ZoneReads
from quickzones.errors import ConfigurationError, CorruptRecord, ItemNotFound, LeaseLost
from quickzones.store.kv import KVTransaction
from quickzones.store.records import WorkItem, ZoneId


class Completion(ZoneReads):
    """``complete``, ``cancel`` and ``complete_many`` of Cassandra zones."""

    def record_outcome(
        self,
        zone: ZoneId,
        item: WorkItem,
        state: str,
        *,
        result: Any = None,
        reason: str | None = None,
    ) -> None:
        """Nothing: Cassandra zones keep no outcome records (capabilities.outcome_records)."""

    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        tr: KVTransaction | None = None,
        result: Any = None,  # no outcome records here (capabilities.outcome_records)
    ) -> None:
        """Delete the item (only for its holder, with ``lease_id``). ``tr`` is refused:
        a Cassandra delete cannot commit atomically with a KV transaction, so
        transactional (exactly-once) handlers need KV zones."""
        if tr is not None:
            raise ConfigurationError(
                "complete(..., tr=...) is not supported for Cassandra zones: the item's "
                "delete cannot join a KV transaction; use KV zones for transactional handlers"
            )
        done = [False]

        def decide(item: WorkItem | None) -> Plan | None:
            if item is None:
                if done[0]:
                    return None
                raise ItemNotFound(item_id)
            if lease_id is not None and item.lease_id != lease_id:
                raise LeaseLost(item_id)
            done[0] = True
            return self._plan_delete(zone, item)

        self._apply(zone, item_id, decide)

    def cancel(self, zone: ZoneId, item_id: str) -> None:
        """Delete an item whoever holds it."""
        self.complete(zone, item_id, None)

    def complete_many(
        self,
        zone: ZoneId,
        leased: Sequence[tuple[str, str]],
        *,
        results: Mapping[str, Any] | None = None,  # no outcome records here
    ) -> list[Exception | None]:
        """One conditional batch for the zone; if refused, each item on its own so an item
        another holder took is reported, not fatal."""
        rows = self._read_many(zone, [i for i, _ in leased])
        out: list[Exception | None] = []
        plans: list[Plan] = []
        for item_id, lease_id in leased:
            row = rows.get(item_id)
            try:
                item = self._check_holder(
                    None if row is None else self.table.to_item(zone, row), item_id, lease_id
                )
            except (ItemNotFound, LeaseLost, CorruptRecord) as err:
                out.append(err)
                continue
            plans.append(self._plan_delete(zone, item))
            out.append(None)
        if not plans:
            return out
        if self.table.cas([s for p in plans for s in p.statements]):
            return out
        for n, (item_id, lease_id) in enumerate(leased):
            if out[n] is not None:
                continue
            try:
                self.complete(zone, item_id, lease_id)
            except ItemNotFound:
                out[n] = None  # our refused-or-unknown batch may have deleted it
                try:
                    if self.table.read_one(zone, item_id, serial=True) is not None:
                        out[n] = LeaseLost(item_id)
                except CassandraError as err:
                    out[n] = err
            except (LeaseLost, CorruptRecord, CassandraError) as err:
                out[n] = err
        return out
