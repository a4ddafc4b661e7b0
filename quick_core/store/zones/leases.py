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
    LAPSED_LEASE_META,
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
        """Lease ``item`` for ``lease_ms`` from ``now`` (``order_key``: its order entry's
        key where the caller read it, not packed again). A lease to start at once counts
        the run here (attempts + 1); a ``held`` one (leased to wait: a timer's look-ahead,
        a consumer's look-ahead beyond its free workers) counts nothing until the worker's
        start check (:meth:`start`) turns it into a run, so a crash charges only what it
        interrupted (issue 40 point 1)."""
        counted: dict[str, object] = {}
        attempts = item.attempts
        if item.lease_id is not None:
            # A lease that ran out unreleased (completing, requeueing or giving back
            # clears it): its consumer crashed or stalled while holding it. Its late
            # holder is told its lease expired (LAPSED_LEASE_META).
            counted["meta"] = {**item.meta, LAPSED_LEASE_META: item.lease_id}
            if not item.held:
                # A started run lapsed: not a failed attempt (paper section 5), counted
                # apart (RetryPolicy.max_lapses), so an item that kills its consumer every
                # time ends; the next run replaces its count (taken back here, counted
                # again below or at the start). A held lease that lapsed never ran:
                # nothing to count.
                counted["lapses"] = item.lapses + 1
                counted["last_error"] = (
                    "lease lapsed: its consumer stopped or stalled while holding it"
                )
                attempts -= 1
        leased = item.with_(
            vesting_ms=now + lease_ms,
            lease_id=new_lease_id(self.ids),
            commit_order=None,
            attempts=max(0, attempts + (0 if held else 1)),
            held=held,
            vested_ms=item.vesting_ms,  # for its pickup figure (not stored)
            **counted,
        )
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
        started = item.with_(attempts=item.attempts + 1, held=False, commit_order=None)
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
                item.with_(vesting_ms=now_ms(self.clock) + lease_ms, commit_order=None),
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
        updated = item.with_(
            vesting_ms=max(vesting_after(self.clock, delay_ms), not_before_ms or 0),
            lease_id=None,
            held=False,
            # Given back unstarted: this lease was no run, so its count is taken back (a
            # held lease counted none).
            attempts=item.attempts if ran or item.held else max(0, item.attempts - 1),
            error_count=item.error_count + (1 if count_error else 0),
            last_error=error if error is not None else item.last_error,
            meta={**item.meta, **meta} if meta else item.meta,
            commit_order=None,
        )
        return self._move_vesting(tr, zone, item, updated)
