"""Batches and chains (issue 31, point 5): a callback item enqueued in the transaction that
finishes a batch's last item, the paper's transactional style (docs/batches.md).

Per batch, outside every zone's range (so no key of it keeps a pointer alive, invariant 2):

    (root, "b", app, batch_id, "r")                   -> the record: zones left, callback
    (root, "b", app, batch_id, "t", tenant)           -> members of the zone not finished
    (root, "b", app, batch_id, "m", tenant, item_id)  -> b""  (a member not yet finished)
    (root, "b", app, batch_id, "n", state)            -> items finished so (atomic add)
    (root, "b", app, batch_id, "f", tenant, item_id)  -> {st, why}  (did not complete)

Each member item carries ``[batch_id, tenant]`` in its metadata (``_b``); the tenant is the
one its keys were written under. The transaction that completes, cancels or dead-letters a
member (:func:`item_finished`, called by the zone store next to the outcome record) reads
and clears its member key, adds one to its state's count (a blind atomic add: no
conflict), and reads and rewrites its zone's count of members left. Only the transaction
that finishes a zone's last member (or a member that did not complete) reads and rewrites
the batch's record, whose count of zones left reaching zero finishes the batch.

Reading the counts decides "I was the last" in the store: two transactions finishing the
last members of one zone conflict on the zone's count, two finishing the last members of
two zones conflict on the record, and the one that retries sees the other's write (atomic
adds alone would not conflict: both could decide they were last). Counting per zone keeps
that serialisation local: completions in different zones of a batch never conflict until
their zones' last members. The member key makes counting idempotent: a second finish of an
item (a dead letter requeued and run again) finds it gone and counts nothing; a late
holder whose lease was lost, or a completion retried after ``commit_unknown_result``,
never gets here twice, as the item's own record is gone.

The callback is written by the two-part enqueue's part one (:func:`enqueue.part_one`) in
that same transaction, under an id chosen when the batch was enqueued: a crash before the
commit loses neither the last completion nor the callback, one after it has both.

A chain is batches of one item each: step n's batch has step n+1 as its callback, and the
callback's enqueue writes step n+1's batch (whose callback is step n+2) with it. A chain's
batches call back only when their item completed (``on`` "stop").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import msgpack

from quickzones.clock import Clock, now_ms
from quickzones.errors import CorruptRecord, InvalidArgument
from quickzones.store import enqueue as two_part
from quickzones.store import outcomes
from quickzones.store.keys import KeySpace
from quickzones.store.kv import (
    VALUE_SIZE_LIMIT,
    KVStore,
    KVTransaction,
    pack_i64,
    run,
    unpack_i64,
)
from quickzones.store.kv import prefetch as kv_prefetch
from quickzones.store.records import WorkItem, ZoneId, decode_item
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.zonestore import NewItem

# An item's metadata: [batch_id, tenant] of the batch it belongs to.
BATCH_KEY = "_b"
_TAG = msgpack.packb(BATCH_KEY)
# How many failed items a callback's report and a status list; the counts are exact.
MAX_LISTED_FAILURES = 100
# The most steps a chain may have (issue 41 point 14b): its later steps wait in one
# record, which must fit a stored value (kv.VALUE_SIZE_LIMIT); 1,000 small steps take
# about 75 kB. Large payloads fit fewer: enqueue_chain says how many.
MAX_CHAIN_STEPS = 1_000
# How long a batch's keys are kept after its last item finished (for batch_status), and how
# many expired batches one collection transaction clears.
KEEP_MS = 7 * 86_400_000
GC_BATCH = 100
# What a batch's callback does when an item did not complete: run with the failures
# listed ("report", a batch's default), or not run at all ("stop", a chain's step).
REPORT = "report"
STOP = "stop"


class BatchWriter(two_part.ItemWriter, Protocol):
    """The zone store's part the batch needs: its keys, clock-free item writes and the
    top-level queue for the callback's pointer."""

    keys: KeySpace
    toplevel: TopLevelQueue
    clock: Clock

    def tag_item(
        self, tr: KVTransaction, zone: ZoneId, item_id: str, key: str, value: Any
    ) -> WorkItem | None: ...


@dataclass(frozen=True, slots=True)
class Member:
    """An item of a batch, in its zone, ready for part one (its id chosen)."""

    zone: ZoneId
    item: NewItem


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """Where a batch stands: counts of its items, and its callback."""

    batch_id: str
    app: str
    total: int
    completed: int
    dead_lettered: int
    cancelled: int
    callback_id: str | None
    callback_tenant: str | None
    # True once the callback item was enqueued (in the last finishing transaction).
    callback_enqueued: bool
    # (tenant, item_id, state, reason) of items that did not complete, at most
    # MAX_LISTED_FAILURES of them.
    failed: list[tuple[str, str, str, str | None]]

    @property
    def pending(self) -> int:
        return self.total - self.completed - self.dead_lettered - self.cancelled

    @property
    def state(self) -> str:
        """ "running" (items pending, no callback yet), "done" (the callback was
        enqueued), or "failed" (a chain's step did not complete: the chain stopped)."""
        if self.callback_enqueued:
            return "done"
        return "running" if self.pending else "failed"

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "app": self.app,
            "state": self.state,
            "total": self.total,
            "completed": self.completed,
            "dead_lettered": self.dead_lettered,
            "cancelled": self.cancelled,
            "pending": self.pending,
            "callback_id": self.callback_id,
            "callback_tenant": self.callback_tenant,
            "callback_enqueued": self.callback_enqueued,
            "failed": [
                {"tenant": t, "item_id": i, "state": s, "reason": r} for t, i, s, r in self.failed
            ],
        }


# --- the stored forms ----------------------------------------------------------------


def _spec(zone: ZoneId, item: NewItem) -> list[Any]:
    """A callback or chain step as stored in a batch record, enqueued later as is."""
    return [
        zone.tenant,
        item.job_type,
        item.payload,
        item.content_type,
        item.item_id,
        item.priority,
        item.delay_ms,
        item.ttl_ms,
        item.delivery,
        item.meta,
        item.fifo,
    ]


def _unspec(app: str, spec: list[Any]) -> Member:
    tenant, job_type, payload, ctype, item_id, priority, delay, ttl, delivery, meta, fifo = spec
    item = NewItem(
        job_type=job_type,
        payload=payload,
        delay_ms=delay,
        priority=priority,
        item_id=item_id,
        content_type=ctype,
        ttl_ms=ttl,
        delivery=delivery,
        meta=dict(meta),
        fifo=fifo,
    )
    return Member(ZoneId(app, tenant), item)


def _pack(record: dict[str, Any]) -> bytes:
    out: bytes = msgpack.packb(record, use_bin_type=True)
    return out


def _unpack(key: bytes, raw: bytes) -> dict[str, Any]:
    try:
        record = msgpack.unpackb(raw, raw=False)
    except Exception as err:
        raise CorruptRecord(key, f"batch record: {err}") from err
    if not isinstance(record, dict):
        raise CorruptRecord(key, "batch record is not a map")
    return record


def _record(
    total: int,
    callback: Member,
    on_failure: str,
    fail_fast: bool,
    chain: Sequence[Member],
    chain_id: str | None,
    step: int,
) -> dict[str, Any]:
    return {
        "v": 1,
        "n": total,
        "zones": 0,  # zones with members not finished: set by _write
        "f": 0,  # members that did not complete, as far as the record heard
        "cb": _spec(callback.zone, callback.item),
        "on": on_failure,
        "ff": fail_fast,
        "rest": [_spec(m.zone, m.item) for m in chain],
        "chain": chain_id,
        "step": step,
        "fired": False,
    }


# --- writing a batch -------------------------------------------------------------------


def chain_batch_id(chain_id: str, step: int) -> str:
    """The batch whose one item is step ``step`` of a chain."""
    return f"{chain_id}.{step}"


def _write(
    tr: KVTransaction,
    zones: BatchWriter,
    app: str,
    batch_id: str,
    members: Sequence[Member],
    record: dict[str, Any],
) -> None:
    """The batch's record and member keys, and its items through part one, in ``tr``."""
    keys = zones.keys
    _write_keys(
        tr, keys, app, batch_id, [(m.zone.tenant, str(m.item.item_id)) for m in members], record
    )
    for member in members:
        item_id = member.item.item_id
        if item_id is None:
            raise InvalidArgument("item_id", None, "a batch's items need their ids chosen")
        tagged = replace(
            member.item, meta={**member.item.meta, BATCH_KEY: [batch_id, member.zone.tenant]}
        )
        written = two_part.part_one(tr, zones.toplevel, zones, member.zone, tagged)
        if not written.new:
            # Its finish would never be counted: refuse the whole batch (nothing commits).
            raise InvalidArgument(
                "item_id",
                item_id,
                f"is already {written.duplicate} in zone {member.zone}; a batch's items "
                "must be new",
            )


def _write_keys(
    tr: KVTransaction,
    keys: KeySpace,
    app: str,
    batch_id: str,
    members: Sequence[tuple[str, str]],
    record: dict[str, Any],
) -> None:
    """The batch's record, its zones' counts and its members' keys, (tenant, item_id)
    each, in ``tr``."""
    per_zone: dict[str, int] = {}
    for tenant, item_id in members:
        per_zone[tenant] = per_zone.get(tenant, 0) + 1
        tr.set(keys.batch_member_key(app, batch_id, tenant, item_id), b"")
    record["zones"] = len(per_zone)
    tr.set(keys.batch_key(app, batch_id), _pack(record))
    for tenant, left in per_zone.items():
        tr.set(keys.batch_zone_key(app, batch_id, tenant), pack_i64(left))


def enqueue_batch(
    db: KVStore | KVTransaction,
    zones: BatchWriter,
    app: str,
    batch_id: str,
    members: Sequence[Member],
    callback: Member,
    *,
    fail_fast: bool = False,
    charge: two_part.Charge | None = None,
) -> bool:
    """Write a batch and its items in one transaction (all or nothing). False: a batch of
    this id exists already (a retry after ``commit_unknown_result``, or a caller's id
    used twice), and nothing was written."""

    record = _record(len(members), callback, REPORT, fail_fast, (), None, 0)
    return _create(db, zones, app, batch_id, members, record, charge)


def enqueue_chain(
    db: KVStore | KVTransaction,
    zones: BatchWriter,
    app: str,
    chain_id: str,
    steps: Sequence[Member],
    *,
    charge: two_part.Charge | None = None,
) -> bool:
    """Write a chain's first step and its batch; the later steps wait in its record.

    A chain of more than :data:`MAX_CHAIN_STEPS` steps, or whose record would not fit a
    stored value, is refused (``InvalidArgument`` naming the most that fit) before
    anything is written: past that the commit failed with the store's raw
    ``value_too_large``."""
    if len(steps) > MAX_CHAIN_STEPS:
        raise InvalidArgument(
            "steps",
            len(steps),
            f"a chain holds at most {MAX_CHAIN_STEPS:,} steps; enqueue the rest from its "
            "last step's handler, as a chain of its own",
        )
    record = _record(1, steps[1], STOP, False, steps[2:], chain_id, 0)
    size = len(_pack({**record, "zones": len(steps)}))
    if size > VALUE_SIZE_LIMIT:
        # The steps waiting in the record cost about the same each: say how many fit
        # (rounded down: the record's own fields are counted as the steps' share).
        fit = max(2, int(VALUE_SIZE_LIMIT / (size / (len(steps) - 1))))
        raise InvalidArgument(
            "steps",
            len(steps),
            f"the steps after the first wait in one record of {size:,} bytes, over the "
            f"{VALUE_SIZE_LIMIT:,} bytes a stored value holds: at most {fit:,} steps of "
            "this size (smaller payloads fit more, up to "
            f"{MAX_CHAIN_STEPS:,}); keep large data elsewhere and pass its key",
        )
    return _create(db, zones, app, chain_batch_id(chain_id, 0), steps[:1], record, charge)


def _create(
    db: KVStore | KVTransaction,
    zones: BatchWriter,
    app: str,
    batch_id: str,
    members: Sequence[Member],
    record: dict[str, Any],
    charge: two_part.Charge | None,
) -> bool:
    """Write a batch's record and its members in one transaction, unless a batch of this
    id exists (False, nothing written)."""

    def write(tr: KVTransaction) -> bool:
        if tr.get(zones.keys.batch_key(app, batch_id)) is not None:
            return False
        if charge is not None:
            charge(tr)
        _write(tr, zones, app, batch_id, members, record)
        return True

    return run(db, write)


def enqueue_after(
    db: KVStore | KVTransaction,
    zones: BatchWriter,
    first: ZoneId,
    first_id: str,
    then: Member,
    batch_id: str,
    now: int,
) -> bool:
    """Enqueue ``then`` once the queued or running item ``first_id`` of zone ``first``
    completes: ``first`` becomes the one member of a batch (``batch_id``) whose callback is
    ``then``, as a chain's step, in one transaction. A ``first`` already completed (its
    status kept) enqueues ``then`` at once (True); one that did not complete, or is not
    known, is refused, nothing written."""

    def write(tr: KVTransaction) -> bool:
        if tr.get(zones.keys.batch_key(first.app, batch_id)) is not None:
            return False  # a retry after commit_unknown_result: that attempt committed
        tagged = zones.tag_item(tr, first, first_id, BATCH_KEY, [batch_id, first.tenant])
        if tagged is None:
            outcome = outcomes.read(tr, zones.keys, first, first_id, now)
            if outcome is None:
                raise InvalidArgument(
                    "after",
                    first_id,
                    f"names no job queued or running in zone {first}, nor one whose status is"
                    " kept (keep_status_s) as completed",
                )
            if outcome.state != outcomes.COMPLETED:
                raise InvalidArgument(
                    "after", first_id, f"is {outcome.state}: the job after it would never run"
                )
            two_part.part_one(tr, zones.toplevel, zones, then.zone, then.item)
            return True
        if BATCH_KEY in tagged.meta:
            raise InvalidArgument(
                "after",
                first_id,
                "is already in a batch or chain, or has a job after it already",
            )
        if tagged.delivery == "at_most_once":
            # Deleted when it starts: no transaction finishes it (raising writes nothing).
            raise InvalidArgument(
                "after", first_id, "is at-most-once; only an at-least-once job can be waited for"
            )
        record = _record(1, then, STOP, False, (), None, 0)
        _write_keys(tr, zones.keys, first.app, batch_id, [(first.tenant, first_id)], record)
        return False

    return run(db, write)


# --- a member finishes -----------------------------------------------------------------


def prefetch(
    tr: KVTransaction, keys: KeySpace, found: Sequence[tuple[ZoneId, bytes, bytes]]
) -> None:
    """Before a batched completion finishes several items, (zone, item key, raw record)
    each: read the batch keys their finishes will read in one round trip
    (:func:`kv.prefetch`), not two reads an item one after another."""
    wanted: list[bytes] = []
    for zone, key, raw in found:
        if _TAG not in raw:  # cheap: most items are in no batch
            continue
        try:
            item = decode_item(key, raw)
        except CorruptRecord:
            continue
        tag = item.meta.get(BATCH_KEY)
        if tag:
            batch_id, tenant = str(tag[0]), str(tag[1])
            wanted.append(keys.batch_member_key(zone.app, batch_id, tenant, item.item_id))
            wanted.append(keys.batch_zone_key(zone.app, batch_id, tenant))
    if wanted:
        kv_prefetch(tr, list(dict.fromkeys(wanted)))


def item_finished(
    tr: KVTransaction,
    zones: BatchWriter,
    zone: ZoneId,
    item: WorkItem,
    state: str,
    reason: str | None = None,
) -> None:
    """Called in the transaction that completes, cancels or dead-letters ``item``: count
    it in its batch and, if that finishes the batch, enqueue the callback in ``tr``. An
    item of no batch costs one dict lookup."""
    tag = item.meta.get(BATCH_KEY)
    if not tag:
        return
    batch_id, tenant = str(tag[0]), str(tag[1])
    keys = zones.keys
    member = keys.batch_member_key(zone.app, batch_id, tenant, item.item_id)
    if tr.get(member) is None:
        return  # counted already: this item finished before (a dead letter run again)
    tr.clear(member)
    app = zone.app
    failure = state != outcomes.COMPLETED
    tr.add(keys.batch_count_key(app, batch_id, state), pack_i64(1))
    if failure:
        failed = keys.batch_failed_key(app, batch_id, tenant, item.item_id)
        tr.set(failed, _pack({"st": state, "why": reason}))
    zone_key = keys.batch_zone_key(app, batch_id, tenant)
    left = unpack_i64(tr.get(zone_key)) - 1
    tr.set(zone_key, pack_i64(left))
    if left > 0 and not failure:
        return  # not its zone's last member: the batch's record is not touched
    key = keys.batch_key(app, batch_id)
    raw = tr.get(key)
    if raw is None:
        return  # the batch was deleted
    record = _unpack(key, raw)
    if left <= 0:
        record["zones"] -= 1
        if record["zones"] <= 0:
            # Every item finished: the batch's keys are collected KEEP_MS from now.
            tr.set(keys.batch_expiry_key(now_ms(zones.clock) + KEEP_MS, app, batch_id), b"")
    if failure:
        record["f"] += 1
    finished = record["zones"] <= 0 or (record["ff"] and record["f"] > 0)
    if finished and not record["fired"] and (record["on"] == REPORT or record["f"] == 0):
        record["fired"] = True
        _call_back(tr, zones, app, batch_id, record)
    tr.set(key, _pack(record))


def _counts(
    tr: KVTransaction, keys: KeySpace, app: str, batch_id: str, *, snapshot: bool = False
) -> dict[str, int]:
    """Items of the batch finished so far, by state."""
    return {
        state: unpack_i64(tr.get(keys.batch_count_key(app, batch_id, state), snapshot=snapshot))
        for state in (outcomes.COMPLETED, outcomes.DEAD_LETTERED, outcomes.CANCELLED)
    }


def _failures(
    tr: KVTransaction, keys: KeySpace, app: str, batch_id: str, *, snapshot: bool = False
) -> list[tuple[str, str, str, str | None]]:
    """The first MAX_LISTED_FAILURES items of the batch that did not complete."""
    rows = tr.get_range(
        *keys.batch_failed_range(app, batch_id), limit=MAX_LISTED_FAILURES, snapshot=snapshot
    )
    out: list[tuple[str, str, str, str | None]] = []
    for key, raw in rows:
        tenant, item_id = keys.unpack_batch_failed_key(key)
        value = _unpack(key, raw)
        out.append((tenant, item_id, str(value["st"]), value.get("why")))
    return out


def _call_back(
    tr: KVTransaction, zones: BatchWriter, app: str, batch_id: str, record: dict[str, Any]
) -> None:
    callback = _unspec(app, record["cb"])
    item = callback.item
    if record["chain"] is None:
        # A batch's callback learns what became of the items, with its own payload.
        failed = _failures(tr, zones.keys, app, batch_id)
        counts = _counts(tr, zones.keys, app, batch_id)
        dead, cancelled = counts[outcomes.DEAD_LETTERED], counts[outcomes.CANCELLED]
        report = {
            "batch_id": batch_id,
            "total": record["n"],
            "completed": counts[outcomes.COMPLETED],
            "dead_lettered": dead,
            "cancelled": cancelled,
            "failed": [
                {"tenant": t, "item_id": i, "state": s, "reason": r} for t, i, s, r in failed
            ],
            "failed_more": dead + cancelled - len(failed),
            "payload": json.loads(item.payload) if item.content_type == "json" else None,
        }
        body = json.dumps(report, separators=(",", ":")).encode()
        item = replace(item, payload=body, content_type="json")
        callback = Member(callback.zone, item)
    if record["chain"] is not None and record["rest"]:
        # The next step is itself a chain's batch of one, calling back the step after it.
        rest = [_unspec(app, spec) for spec in record["rest"]]
        step = int(record["step"]) + 1
        nxt = _record(1, rest[0], STOP, False, rest[1:], record["chain"], step)
        _write(tr, zones, app, chain_batch_id(record["chain"], step), [callback], nxt)
        return
    two_part.part_one(tr, zones.toplevel, zones, callback.zone, callback.item)


# --- collection ----------------------------------------------------------------------


def collect_expired(kv: KVStore, keys: KeySpace, now: int, limit: int = GC_BATCH) -> int:
    """Clear, in one transaction, the keys of up to ``limit`` batches whose items all
    finished KEEP_MS before ``now``; reads only the expired start of the expiry index.
    A consumer's maintenance calls it with the outcome records' collection."""

    def collect(tr: KVTransaction) -> int:
        rows = tr.get_range(*keys.batch_expiry_range(now), limit=limit)
        for index_key, _ in rows:
            tr.clear_range(*keys.batch_range(*keys.unpack_batch_expiry_key(index_key)))
            tr.clear(index_key)
        return len(rows)

    return run(kv, collect)


# --- reading -----------------------------------------------------------------------------


def status(
    db: KVStore | KVTransaction, keys: KeySpace, app: str, batch_id: str
) -> BatchStatus | None:
    """A batch's counts and callback, read in one transaction (snapshot reads: no
    conflict with the consumers finishing its items); None when no such batch."""

    def read(tr: KVTransaction) -> BatchStatus | None:
        key = keys.batch_key(app, batch_id)
        raw = tr.get(key, snapshot=True)
        if raw is None:
            return None
        record = _unpack(key, raw)
        callback = _unspec(app, record["cb"])
        failed = _failures(tr, keys, app, batch_id, snapshot=True)
        counts = _counts(tr, keys, app, batch_id, snapshot=True)
        return BatchStatus(
            batch_id=batch_id,
            app=app,
            total=int(record["n"]),
            completed=counts[outcomes.COMPLETED],
            dead_lettered=counts[outcomes.DEAD_LETTERED],
            cancelled=counts[outcomes.CANCELLED],
            callback_id=callback.item.item_id,
            callback_tenant=callback.zone.tenant,
            callback_enqueued=bool(record["fired"]),
            failed=failed,
        )

    return run(db, read)
