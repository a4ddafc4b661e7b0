"""Completion (Algorithm 3's last step): delete finished items and record their outcome,
one item or a batch over several zones in one transaction; cancel deletes whoever holds it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quickzones.clock import now_ms
from quickzones.errors import (
    CorruptRecord,
    ItemNotFound,
    LeaseLost,
)
from quickzones.store import batches, flow_key_lapses, flow_keys, outcomes
from quickzones.store.kv import (
    OWN_STORE,
    KVError,
    KVTransaction,
    get_many,
    pack_i64,
    run,
    transactional,
)
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.zones.items import ZoneItems, lease_lost


class ZoneCompletion(ZoneItems):
    @transactional
    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        result: Any = None,
        tr: KVTransaction = OWN_STORE,
    ) -> None:
        item = self._read_item(tr, zone, item_id)
        if item is None:
            raise ItemNotFound(item_id)
        if lease_id is not None and item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now_ms(self.clock))
        self._delete_item(tr, zone, item)
        state = outcomes.COMPLETED if lease_id is not None else outcomes.CANCELLED
        turn = outcomes.finished(
            tr, self.keys, zone, item, state, now_ms(self.clock), result=result
        )
        self.take_turn(tr, zone, turn)
        batches.item_finished(tr, self._batches(), zone, item, state)

    def record_outcome(
        self,
        zone: ZoneId,
        item: WorkItem,
        state: str,
        *,
        result: Any = None,
        reason: str | None = None,
    ) -> None:
        """The outcome record of an item already deleted (an at-most-once item whose run
        ended), in a transaction of its own, only if its type keeps one; and the release
        of the flow key it holds."""
        if not item.meta.get(outcomes.POLICY_KEY) and not item.meta.get(flow_keys.FLOW_META):
            return
        now = now_ms(self.clock)

        def record(tr: KVTransaction) -> None:
            turn = outcomes.finished(
                tr, self.keys, zone, item, state, now, result=result, reason=reason, run_ended=True
            )
            self.take_turn(tr, zone, turn)

        run(self.kv, record)

    def extend_key_hold(self, zone: ZoneId, item: WorkItem, lease_ms: int) -> int:
        """Renew, for ``lease_ms`` from now, the hold a running at-most-once ``item``
        (deleted as its handler started) has on its one-at-a-time key
        (:func:`flow_key_lapses.extend_hold`), in a transaction of its own; returns the new end
        (store ms). :class:`LeaseLost` when the hold lapsed and the key passed on."""
        until = now_ms(self.clock) + lease_ms

        def renew(tr: KVTransaction) -> bool:
            return flow_key_lapses.extend_hold(tr, self.keys, zone, item, until)

        if not run(self.kv, renew):
            raise LeaseLost(item.item_id, "its one-at-a-time key's hold lapsed and passed on")
        return until

    def complete_many(
        self,
        zone: ZoneId,
        leased: Sequence[tuple[str, str]],
        *,
        results: Mapping[str, Any] | None = None,
    ) -> list[Exception | None]:
        """One transaction for a batch: an item another holder took is reported, not fatal.

        After a maybe-committed attempt (``commit_unknown_result``) the retry finds the
        items that attempt completed gone: they are reported completed, not lost.
        """
        return self.complete_zones([(zone, leased, results)])[0]

    def complete_zones(
        self,
        groups: Sequence[tuple[ZoneId, Sequence[tuple[str, str]], Mapping[str, Any] | None]],
    ) -> list[list[Exception | None]]:
        """:meth:`complete_many` for several zones in one transaction: one outcome list
        per (zone, [(item_id, lease_id)], results) group, in order.

        Each item is checked as :meth:`complete` checks it (its record read with a
        conflict; a lease id must match the stored one, else :class:`LeaseLost`; no record,
        :class:`ItemNotFound`), so a completion that lost its lease is reported per item
        and the others still commit. Every record is read at once (one round trip for
        the batch) and used as read: nothing is read twice. Each zone's count moves by
        one atomic add. A group's ``results``: handler return values by item id, kept if
        the item's type asks.
        """
        maybe_done: set[tuple[ZoneId, str]] = set()
        attempt: list[tuple[ZoneId, str]] = []

        def batch(tr: KVTransaction) -> list[list[Exception | None]]:
            attempt.clear()
            keys = [
                self.keys.item_key(zone, item_id)
                for zone, leased, _ in groups
                for item_id, _ in leased
            ]
            found = get_many(tr, keys)
            zone_of = [zone for zone, leased, _ in groups for _ in leased]
            batch_items = [(z, k, r) for z, k, r in zip(zone_of, keys, found, strict=True) if r]
            batches.prefetch(tr, self.keys, batch_items)
            raws = iter(found)
            key_iter = iter(keys)
            now = now_ms(self.clock)
            out: list[list[Exception | None]] = []
            deleted: set[bytes] = set()
            for zone, leased, results in groups:
                zone_out: list[Exception | None] = []
                done = 0
                for item_id, lease_id in leased:
                    key, raw = next(key_iter), next(raws)
                    if key in deleted:
                        raw = None  # a repeat of an item completed above finds it gone
                    if raw is None:
                        gone = (zone, item_id) in maybe_done
                        zone_out.append(None if gone else ItemNotFound(item_id))
                        continue
                    try:
                        item = self._decode(tr, zone, key, raw)
                    except CorruptRecord as err:
                        zone_out.append(err)
                        continue
                    if lease_id is not None and item.lease_id != lease_id:
                        zone_out.append(lease_lost(item, lease_id, now))
                        continue
                    self._delete_item(tr, zone, item, count=False)
                    deleted.add(key)
                    done += 1
                    state = outcomes.COMPLETED if lease_id is not None else outcomes.CANCELLED
                    result = None if results is None else results.get(item_id)
                    turn = outcomes.finished(tr, self.keys, zone, item, state, now, result=result)
                    self.take_turn(tr, zone, turn)
                    batches.item_finished(tr, self._batches(), zone, item, state)
                    attempt.append((zone, item_id))
                    zone_out.append(None)
                if done:
                    tr.add(self.keys.count_key(zone), pack_i64(-done))
                out.append(zone_out)
            return out

        def remember(err: KVError) -> None:
            if err.maybe_committed:
                maybe_done.update(attempt)

        return run(self.kv, batch, on_retry=remember)

    def cancel(self, zone: ZoneId, item_id: str) -> None:
        """Delete an item whoever holds it."""
        self.complete(zone, item_id, None)
