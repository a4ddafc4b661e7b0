"""A zone visit in one transaction of the pointers' store (beyond the paper,
``one_transaction_visits``): one zone's, or several selected zones' at once
(``visits_per_transaction``), each zone's steps exactly as alone
(:meth:`~quickzones.consumer.visit.ZoneVisitor.visit_zone`). Written off (nothing
committed) on a conflict or an app with dispatch limits; the caller then visits the zones
in the paper's three transactions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from quickzones.consumer.state import Cluster
from quickzones.consumer.visit_rules import NeedsThreeTransactions, VisitRules, ZoneVisit, visit_key
from quickzones.errors import StorageError, ZoneLeaseFailed
from quickzones.store.kv import KVTransaction, _Uncommitted, relax_durability

if TYPE_CHECKING:
    from quickzones.consumer.visit import ZoneVisitor


class NothingLeased(Exception):
    """Leaves a one-transaction visit uncommitted: it leased no pointer."""


def _plus(told: Callable[[int], None], before: int, items: int) -> None:
    """Tell ``told`` of ``items`` more than the ``before`` taken already."""
    told(before + items)


def forget(visits: Sequence[ZoneVisit]) -> None:
    """A transaction that did not commit left nothing: its visits took nothing."""
    for v in visits:
        v.clear()


def visit_in_one_transaction(
    visitor: ZoneVisitor,
    cluster: Cluster,
    visits: Sequence[ZoneVisit],
    rules: VisitRules,
    capacity: Callable[[], int] | None,
) -> bool:
    """The visits committed once: no other consumer sees a zone between its pointer
    lease and its requeue, and a crash mid-visit leaves nothing leased. False when
    written off (nothing committed): a conflict, twice for several zones (most often
    an enqueue into one of them, which the second try sees; a lone zone's conflict is
    more likely another consumer's visit, which the three transactions' small pointer
    lease loses to quickly, or wins), or an app with dispatch limits."""
    idle = None if rules.start_now is None else rules.start_now()
    failed: list[str] = []

    def visit(tr: KVTransaction) -> None:
        failed.clear()
        # Its items start without waiting for the server's log flush: a crash of the
        # server undoes the leases, and the items run again (kv.relax_durability).
        relax_durability(tr)
        # Read each try: a try that read its zones gave back the room beyond what it
        # leased (rules.taking), and a retry takes no more than is still claimed.
        left, starting = None if capacity is None else capacity(), idle
        spent = visitor.budget()  # one for the batch's zones: one transaction
        for v in visits:
            v.clear()
        visitor.read_ahead.before(cluster, visits, tr, room=left, horizon_ms=rules.horizon_ms)
        taken = 0
        for n, v in enumerate(visits):
            room = v.room if left is None else min(v.room, left)
            if room <= 0 or spent.reached:
                break  # not leased: vested for the next scan
            # The last zone's dequeue tells what the whole visit takes as soon as it
            # decided, before it writes (dequeue.Left.taking).
            taking = rules.taking if n == len(visits) - 1 else None
            try:
                visitor.visit_zone(
                    cluster, v, room, rules, tr, spent, left, starting,
                    taking=None if taking is None else partial(_plus, taking, taken),
                )  # fmt: skip
            except ZoneLeaseFailed as err:
                failed.append(err.reason)
                continue
            taken += len(v.items)
            if left is not None:
                left -= len(v.items)
            if starting is not None:
                starting = max(0, starting - len(v.items))
        if all(v.pointer is None for v in visits):
            raise NothingLeased  # nothing to commit
        if rules.taking is not None:
            rules.taking(taken)

    try:
        for tries_left in range(1 if len(visits) > 1 else 0, -1, -1):
            done = cluster.toplevel.run_visit(visit)
            if not isinstance(done, _Uncommitted):
                break
            visitor.emit("one_transaction_visit_conflict")
            if not tries_left:
                if len(visits) == 1:  # a batch's culprit is found by its zones' own
                    visitor.gate.conflicted(visit_key(visits[0].ref))
                forget(visits)
                return False
    except NeedsThreeTransactions:
        forget(visits)
        return False
    except NothingLeased:
        forget(visits)
    except StorageError as err:
        # Nothing committed; the zones' pointers vest again for a later visit. Raised
        # on, as the three transactions' errors are, so the scanner backs off (a full
        # disk refuses every commit: a visit returning as if done was retried hot).
        visitor.emit("dequeue_error", error=str(err))
        forget(visits)
        raise
    else:
        for v in visits:
            visitor.gate.committed(visit_key(v.ref))
    for reason in failed:
        visitor.emit("pointer_lease_failed", reason=reason)
    leased = [v for v in visits if v.pointer is not None]
    if len(visits) > 1:
        visitor.emit("visits_batched", zones=len(leased), items=sum(len(v.items) for v in leased))
    for v in leased:
        visitor.emit("pointer_leased", zone=v.zone, lag_ms=visitor.lag_ms(v.ref))
        if v.cut_short:
            visitor.emit("visit_budget_reached", zone=v.zone, items=len(v.items))
        rules.dequeued(v)
        visitor.emit("pointer_" + v.outcome, zone=v.zone)
        visitor.tell(v)
    return True
