"""Per-item leases (paper section 5): a lease is the item's vesting time moved ahead with
a fresh lease id; granting one counts a run (a held one, leased to wait, counts it at its
start check), a lapsed one counts a lapse, not a failure (a held one that lapsed: nothing).
The Worker's start check, extension and requeue check the holder here."""

from __future__ import annotations

from quickzones.clock import now_ms, vesting_after
from quickzones.errors import (
    ItemNotFound,
    ItemNotVested,
)
from quickzones.store import lease_rules
from quickzones.store.kv import (
    OWN_STORE,
    KVTransaction,
    run,
    transactional,
)
from quickzones.store.records import (
    WorkItem,
    ZoneId,
)
from quickzones.store.zones.items import (
    ZoneItems,
    check_lease_duration,
    lease_lost,
    new_lease_id,
)


class ZoneLeases(ZoneItems):
    def _grant_lease(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item: WorkItem,
        now: int,
        lease_ms: int,
        *,
        held: bool = False,
        order_key: bytes | None = None,
    ) -> WorkItem:
        """Lease ``item`` for ``lease_ms`` from ``now`` (:func:`.lease_rules.granted`);
        ``order_key``: its order entry's key where the caller read it, not packed again."""
        leased = lease_rules.granted(item, now, lease_ms, new_lease_id(self.ids), held=held)
        return self._move_vesting(tr, zone, item, leased, leased=True, old_key=order_key)

    @transactional
    def start(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        *,
        tr: KVTransaction = OWN_STORE,
    ) -> WorkItem:
        """A Worker's check just before it starts an item that waited for it (Algorithm
        3): raises ``ItemNotFound`` (completed or cancelled meanwhile) or ``LeaseLost``
        (another holder), so such an item never starts; else returns the stored item.
        A read where the run was counted when the lease was granted; a held lease (leased
        to wait) is turned into a started one here, its run counted (a write)."""
        # A run counted at its grant is left as read, so the record kept at its lease
        # stays kept for the completion's read (one decode an item, at its dequeue).
        read = self._read_item(tr, zone, item_id, keep=True)
        item = self._check_holder(read, item_id, lease_id)
        if not item.held:
            return item
        started = lease_rules.started(item)
        self._keep_leased(self._rewrite_header(tr, zone, item, started), started)
        return started

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem:
        check_lease_duration(lease_ms)

        def lease(tr: KVTransaction) -> WorkItem:
            item = self._read_item(tr, zone, item_id)
            if item is None:
                raise ItemNotFound(item_id)
            now = now_ms(self.clock)
            if item.vesting_ms > now:
                raise ItemNotVested(item_id, item.vesting_ms)
            return self._grant_lease(tr, zone, item, now, lease_ms)

        return run(self.kv, lease)

    def _check_holder(self, item: WorkItem | None, item_id: str, lease_id: str) -> WorkItem:
        if item is None:
            raise ItemNotFound(item_id)
        if item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now_ms(self.clock))
        return item

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """Holds while the caller holds the lease, or it expired and nobody leased since
        (the lease id is unchanged then)."""
        check_lease_duration(lease_ms)

        def extend(tr: KVTransaction) -> WorkItem:
            item = self._check_holder(self._read_item(tr, zone, item_id), item_id, lease_id)
            return self._move_vesting(
                tr,
                zone,
                item,
                lease_rules.extended(item, now_ms(self.clock), lease_ms),
            )

        return run(self.kv, extend)

    @transactional
    def requeue(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        delay_ms: int,
        *,
        error: str | None = None,
        count_error: bool = True,
        meta: dict[str, object] | None = None,
        not_before_ms: int | None = None,
        ran: bool = True,
        tr: KVTransaction = OWN_STORE,
    ) -> WorkItem:
        item = self._check_holder(self._read_item(tr, zone, item_id), item_id, lease_id)
        updated = lease_rules.requeued(
            item,
            max(vesting_after(self.clock, delay_ms), not_before_ms or 0),
            error=error,
            count_error=count_error,
            meta=meta,
            ran=ran,
        )
        return self._move_vesting(tr, zone, item, updated)
