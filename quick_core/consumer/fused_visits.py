"""One-transaction zone visits (Algorithm 2 fused, beyond the paper): the pointer lease,
the dequeue and the pointer requeue committed as one transaction, for one zone
(``one_transaction_visits``) or for several selected zones at once
(``visits_per_transaction``), each zone exactly as its own one-transaction visit.

None from either function means nothing was written and the caller visits the zone(s) the
paper's way (:class:`~quickzones.consumer.manager.Manager`, three transactions per zone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from quickzones.consumer.state import Cluster, Work
from quickzones.errors import StorageError, ZoneLeaseFailed
from quickzones.store.kv import KVTransaction, _Uncommitted, attempt_once
from quickzones.store.records import Pointer, WorkItem, ZoneId
from quickzones.store.toplevel import PointerRef
from quickzones.store.zonestore import CorruptItem, VisitTransactions

if TYPE_CHECKING:
    from quickzones.consumer.manager import Manager


class _LimitedApp(Exception):
    """Leaves a one-transaction visit uncommitted: the zone's app has dispatch limits."""


@dataclass(slots=True)
class _Visited:
    """One zone's part of a batched visit, as its transaction left it."""

    ref: PointerRef
    # Item id -> job type reserved under a cap: a map per zone, as ids are only unique
    # within a zone; kept across tries of the transaction.
    reserved: dict[str, str] = field(default_factory=dict)
    pointer: Pointer | None = None
    items: list[WorkItem] = field(default_factory=list)
    corrupt: list[CorruptItem] = field(default_factory=list)
    outcome: str = ""


def visit_in_one_transaction(
    manager: Manager,
    cluster: Cluster,
    ref: PointerRef,
    room: int,
    hand_out: Callable[[list[Work]], None] | None,
    horizon_ms: int = 0,
) -> list[Work] | None:
    """The same visit committed once (``one_transaction_visits``): the pointer lease,
    the dequeue and the requeue (or the pointer's collection) are the three
    transactions' writes in one, so no other consumer can see the zone in between, as
    with the lease, and nothing is left leased by a crash mid-visit. None (nothing
    written) when the zone's app has dispatch limits: their slots and grants are taken
    outside any transaction, between the lease and the dequeue, so that visit takes the
    three transactions, as does a visit whose commit conflicts."""
    cfg = manager.config
    zones = cast(VisitTransactions, cluster.zones)
    lease_ms = int(cfg.pointer_lease_s * 1000)
    reserved: dict[str, str] = {}
    accept = manager.accept_factory(reserved)

    def visit(tr: KVTransaction) -> tuple[Pointer, list[WorkItem], list[CorruptItem], str]:
        pointer = cluster.toplevel.lease_pointer(
            ref, lease_ms, accept=manager.accept_pointer, horizon_ms=horizon_ms, tr=tr
        )
        zone = pointer.zone
        if manager.limits is not None and manager.limits.get(zone.app, tr).limits_dispatch:
            raise _LimitedApp
        items, corrupt = zones.dequeue(
            zone,
            room,
            int(cfg.item_lease_s * 1000),
            accept=accept,
            resolve=manager.resolve,
            horizon_ms=horizon_ms,
            tr=tr,
        )
        outcome = cluster.toplevel.requeue_pointer(
            pointer,
            lambda t: cluster.zones.min_vesting_ms(zone, tr=t),
            lambda t: cluster.zones.zone_is_empty(t, zone),
            min_inactive_ms=int(cfg.min_inactive_s * 1000),
            active=bool(items),
            tr=tr,
        )
        return pointer, items, corrupt, outcome

    items: list[WorkItem] = []
    try:
        done = attempt_once(cluster.toplevel.kv, visit)
        if isinstance(done, _Uncommitted):
            # A conflict (another consumer's visit, an enqueue into the zone): no
            # backoff, the paper's three transactions at once, whose small pointer
            # lease loses quickly to the other visit or wins.
            manager.one_transaction.conflicted()
            manager.emit("one_transaction_visit_conflict")
            return None
        manager.one_transaction.committed()
        pointer, items, corrupt, outcome = done
    except _LimitedApp:
        return None
    except ZoneLeaseFailed as err:
        manager.emit("pointer_lease_failed", reason=err.reason)
        return []
    except StorageError as err:
        manager.emit("dequeue_error", error=str(err))
        return []
    finally:
        manager.settle(reserved, items)
    zone = pointer.zone
    manager.emit("pointer_leased", zone=zone, lag_ms=manager.lag_ms(ref))
    works = manager.dequeued(cluster, ref, zone, items, corrupt, 0, hand_out)
    manager.emit("pointer_" + outcome, zone=zone)
    return works


def visit_in_one_batch(
    manager: Manager,
    cluster: Cluster,
    refs: Sequence[PointerRef],
    hand_out: Callable[[list[Work]], None] | None,
    horizon_ms: int,
) -> list[Work] | None:
    """Several zones' one-transaction visits, committed together. Each zone leases its
    pointer, dequeues at most :meth:`visit_size` and requeues the pointer, as alone; the
    batch never takes more than the consumer's free capacity, and a zone it has no room
    left for is not leased. A pointer it cannot lease (gone, leased elsewhere, another
    app's) is skipped. None (nothing written) when the commit conflicts or a zone's
    app has dispatch limits: the caller visits each zone on its own. A conflicting
    batch is tried once more first."""
    cfg = manager.config
    zones = cast(VisitTransactions, cluster.zones)
    lease_ms = int(cfg.pointer_lease_s * 1000)
    item_lease_ms = int(cfg.item_lease_s * 1000)
    capacity = manager.in_flight.capacity()
    if capacity <= 0:
        return []
    size = manager.visit_size()
    visits = [_Visited(ref) for ref in refs]
    failed: list[str] = []

    def visit(tr: KVTransaction) -> None:
        failed.clear()
        left = capacity
        for v in visits:
            v.pointer, v.items, v.corrupt, v.outcome = None, [], [], ""
        for v in visits:
            if left <= 0:
                break  # not leased: vested for the next scan
            try:
                pointer = cluster.toplevel.lease_pointer(
                    v.ref, lease_ms, accept=manager.accept_pointer, horizon_ms=horizon_ms, tr=tr
                )
            except ZoneLeaseFailed as err:
                failed.append(err.reason)
                continue
            zone = pointer.zone
            if manager.limits is not None and manager.limits.get(zone.app, tr).limits_dispatch:
                raise _LimitedApp
            v.items, v.corrupt = zones.dequeue(
                zone,
                min(size, left),
                item_lease_ms,
                accept=manager.accept_factory(v.reserved),
                resolve=manager.resolve,
                horizon_ms=horizon_ms,
                tr=tr,
            )
            left -= len(v.items)

            def min_vesting(t: KVTransaction, z: ZoneId = zone) -> int | None:
                return cluster.zones.min_vesting_ms(z, tr=t)

            def is_empty(t: KVTransaction, z: ZoneId = zone) -> bool:
                return cluster.zones.zone_is_empty(t, z)

            v.outcome = cluster.toplevel.requeue_pointer(
                pointer,
                min_vesting,
                is_empty,
                min_inactive_ms=int(cfg.min_inactive_s * 1000),
                active=bool(v.items),
                tr=tr,
            )
            v.pointer = pointer

    committed = False
    try:
        # A batch's conflict is most often an enqueue into one of its zones, not a
        # competing consumer: the batch is run again at once (it now sees that item),
        # and only a second conflict sends its zones to visits of their own.
        for tries_left in (1, 0):
            done = attempt_once(cluster.toplevel.kv, visit)
            if not isinstance(done, _Uncommitted):
                break
            manager.emit("one_transaction_visit_conflict")
            if not tries_left:
                manager.one_transaction.conflicted()
                return None
        committed = True
        manager.one_transaction.committed()
    except _LimitedApp:
        return None
    except StorageError as err:
        manager.emit("dequeue_error", error=str(err))
        return []
    finally:
        for v in visits:
            manager.settle(v.reserved, v.items if committed else [])
    for reason in failed:
        manager.emit("pointer_lease_failed", reason=reason)
    done_visits = [v for v in visits if v.pointer is not None]
    manager.emit(
        "visits_batched", zones=len(done_visits), items=sum(len(v.items) for v in done_visits)
    )
    works: list[Work] = []
    for v in done_visits:
        assert v.pointer is not None
        zone = v.pointer.zone
        manager.emit("pointer_leased", zone=zone, lag_ms=manager.lag_ms(v.ref))
        works += manager.dequeued(cluster, v.ref, zone, v.items, v.corrupt, 0, hand_out)
        manager.emit("pointer_" + v.outcome, zone=zone)
    return works
