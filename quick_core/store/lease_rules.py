"""What a per-item lease does to an item (paper section 5), written once for every zone
store: a grant moves the item's vesting time ahead under a fresh lease id and counts a run
(a held lease, leased to wait, counts it at its start check); a lease that lapsed counts a
lapse, not a failure (a held one that lapsed: nothing); a requeue releases the lease and
vests the item again. Pure functions of the item: each store reads and writes the item its
own way (KV keys, SQL rows) around them."""

from __future__ import annotations

from typing import Any

from quickzones.store.records import WorkItem

# Meta of an item leased again after a lease lapsed: that lease's id, so its late holder
# is told its lease expired rather than that its id is wrong.
LAPSED_LEASE_META = "_lapsed_lease"


def granted(
    item: WorkItem, since_ms: int, lease_ms: int, lease_id: str, *, held: bool = False
) -> WorkItem:
    """``item`` leased for ``lease_ms`` from ``since_ms``. A lease to start at once
    counts the run here (attempts + 1); a ``held`` one (a timer's look-ahead, a consumer's
    look-ahead beyond its free workers) counts nothing until the worker's start check
    (:func:`started`) turns it into a run, so a crash charges only what it interrupted
    (issue 40 point 1)."""
    counted: dict[str, Any] = {}
    attempts = item.attempts
    if item.lease_id is not None:
        # A lease that ran out unreleased (completing, requeueing or giving back clears
        # it): its consumer crashed or stalled while holding it. Its late holder is told
        # its lease expired (LAPSED_LEASE_META).
        counted["meta"] = {**item.meta, LAPSED_LEASE_META: item.lease_id}
        if not item.held:
            # A started run lapsed: not a failed attempt (paper section 5), counted apart
            # (RetryPolicy.max_lapses), so an item that kills its consumer every time
            # ends; the next run replaces its count (taken back here, counted again below
            # or at the start). A held lease that lapsed never ran: nothing to count.
            counted["lapses"] = item.lapses + 1
            counted["last_error"] = "lease lapsed: its consumer stopped or stalled while holding it"
            attempts -= 1
    return item.with_(
        vesting_ms=since_ms + lease_ms,
        lease_id=lease_id,
        commit_order=None,
        attempts=max(0, attempts + (0 if held else 1)),
        held=held,
        vested_ms=item.vesting_ms,  # for its pickup figure (not stored)
        **counted,
    )


def started(item: WorkItem) -> WorkItem:
    """A held lease turned into a started run at the worker's start check: its run
    counted."""
    return item.with_(attempts=item.attempts + 1, held=False, commit_order=None)


def extended(item: WorkItem, now_ms: int, lease_ms: int) -> WorkItem:
    """The holder's lease running ``lease_ms`` from ``now_ms``."""
    return item.with_(vesting_ms=now_ms + lease_ms, commit_order=None)


def requeued(
    item: WorkItem,
    vesting_ms: int,
    *,
    error: str | None = None,
    count_error: bool = True,
    meta: dict[str, object] | None = None,
    ran: bool = True,
) -> WorkItem:
    """The lease released and the item vesting again at ``vesting_ms``; error count + 1
    unless ``count_error`` is False; ``meta`` merged in; ``ran=False``: given back
    unstarted, so this lease was no run and its count is taken back (a held lease counted
    none)."""
    return item.with_(
        vesting_ms=vesting_ms,
        lease_id=None,
        held=False,
        attempts=item.attempts if ran or item.held else max(0, item.attempts - 1),
        error_count=item.error_count + (1 if count_error else 0),
        last_error=error if error is not None else item.last_error,
        meta={**item.meta, **meta} if meta else item.meta,
        commit_order=None,
    )
