"""A transactional handler's run (``@quick.job(..., transactional=True)``): its effects
and its item's completion commit in one KV transaction (invariant 9: exactly once for
effects kept in the store), under a lease held for the transaction's whole life."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quickzones.clock import now_ms
from quickzones.consumer.lease_extender import due_for_extension
from quickzones.consumer.state import Work
from quickzones.errors import QuickError, StorageError
from quickzones.registry import JobType
from quickzones.store.kv import NOT_COMMITTED, TRANSACTION_LIFETIME_S, KVError, run

if TYPE_CHECKING:
    from quickzones.consumer.worker import Worker

# How much longer than a transaction may live a transactional handler's lease is taken
# before each attempt: the read version is taken just after, well within this.
TRANSACTIONAL_LEASE_MARGIN_S = 1.0


def run_transactional(worker: Worker, work: Work, job: JobType) -> None:
    """Handler effects and the completion commit in one KV transaction (invariant 9).

    The lease extender leaves this item alone: its extension rewrites the item record
    that the completion reads, so an extension committed while the transaction is open
    makes the completion conflict, and the handler re-ran forever. So before each
    attempt the worker takes the lease for the transaction's whole life instead: a
    transaction commits within ``TRANSACTION_LIFETIME_S`` of its read version on every
    store, or not at all, so a lease that lasts past that cannot lapse while the
    handler runs, however short ``item_lease_s`` is (issue 40 point 8: with a lease of
    a second or two, a slower handler's item was leased again by another consumer and
    dead-lettered as "lease lapsed 3 times"). Invariant 4 is unchanged: the completion
    still reads the record, so another holder's lease makes it conflict or fail.
    """
    cluster = worker.clusters[work.cluster]
    if cluster.kv is None:
        raise QuickError("transactional handlers need a KV zone store")
    applied = False

    def body(tr: Any) -> None:
        if applied:
            return  # a maybe-committed attempt did commit: do not run it again
        # The read version now, so the transaction's life starts inside the lease
        # taken just before (a handler may read nothing for a while).
        tr.get_read_version()
        if work.item.vesting_ms - now_ms(worker.clock) < TRANSACTION_LIFETIME_S * 1000:
            # Stalled since the lease was taken: renewing it now would conflict with
            # this transaction, so start the attempt again (before the handler ran).
            raise KVError(NOT_COMMITTED, "the item's lease would end before the commit")
        result = worker._run_handler(work, job, tr)
        cluster.zones.complete(
            work.zone, work.item.item_id, work.item.lease_id, tr=tr, result=result
        )

    def before_retry(err: KVError) -> None:
        nonlocal applied
        if err.maybe_committed:
            # The attempt may have committed; it is no longer in flight, so a fresh
            # read tells: our item gone means it did.
            applied = cluster.zones.get(work.zone, work.item.item_id) is None
        if not applied:
            hold_for_transaction(worker, work)

    hold_for_transaction(worker, work)
    run(cluster.kv, body, on_retry=before_retry)


def hold_for_transaction(worker: Worker, work: Work) -> None:
    """Extend the lease, where it would end within a transaction's lifetime (and a
    margin) or the extender would renew it, to the longer of ``item_lease_s`` and
    that (raises LeaseLost/ItemNotFound if the lease is gone)."""
    hold_s = TRANSACTION_LIFETIME_S + TRANSACTIONAL_LEASE_MARGIN_S
    left_ms = work.item.vesting_ms - now_ms(worker.clock)
    if left_ms >= hold_s * 1000 and not due_for_extension(worker.config, worker.clock, work):
        return
    lease_ms = int(max(worker.config.item_lease_s, hold_s) * 1000)
    try:
        work.item = worker.ops.extend(work, lease_ms)
    except StorageError as err:  # LeaseLost and ItemNotFound go to the caller
        worker.emit("extend_error", error=str(err))  # the completion checks the lease
