"""Outcome records: what became of a finished item (job status, results, deduplication).

A small record per finished item, written in the same transaction that completes, cancels
or dead-letters it, so a status read never sees an item that is neither queued nor
finished:

    (root, "o", app, tenant, item_id)                   -> outcome record (msgpack)
    (root, "oe", expires_ms, app, tenant, item_id)      -> b""  (expiry index)

Both are outside the zone's range ``(root, "z", app, tenant)``, so a zone holding only
outcome records is empty: they never keep its pointer alive (invariant 2 reads only the
zone range). Expired records are collected from the start of the expiry index in bounded
batches (:func:`collect_expired`), never by a scan of all tenants.

Records are written only for items whose job type asks (``keep_status_s``,
``keep_result_s``, ``dedupe_s``, or the client's ``keep_status_s`` default): the enqueue
copies the policy into the item's metadata (``_o``), so the completing transaction needs no
registry and an item of a type that asks nothing costs one dict lookup at completion.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from quickzones.errors import CorruptRecord, InvalidArgument, QuickError
from quickzones.store import flow_key_lapses, flow_keys
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.progress import PROGRESS_KEY, progress_of
from quickzones.store.records import DeadLetter, WorkItem, ZoneId

log = logging.getLogger("quick.outcomes")

# A stored result fits one value on every backend (FoundationDB's value limit is 100 kB).
MAX_RESULT_BYTES = 64 * 1024
# How many expired records one collection step clears: a bounded transaction.
GC_BATCH = 500
# How many such transactions one maintenance call runs at most (the rest waits for the
# next call), and how often a consumer's maintenance should call it.
GC_MAX_BATCHES = 10
COLLECT_EVERY_S = 10.0

POLICY_KEY = "_o"

COMPLETED = "completed"
CANCELLED = "cancelled"
DEAD_LETTERED = "dead_lettered"
# An at-most-once item whose handler raised: it never runs again (issue 28, point 10).
FAILED = "failed"


class DuplicateItemMismatch(QuickError):
    """An enqueue reused the id of a known item (queued, or finished within its dedupe
    window) with a different job type or payload (``differs``): nothing was stored, and
    the caller is told."""

    def __init__(self, zone: str, item_id: str, state: str, differs: str = "payload") -> None:
        self.zone = zone
        self.item_id = item_id
        self.state = state
        self.differs = differs
        super().__init__(
            f"item {item_id!r} in zone {zone} is already {state} with a different {differs}; "
            "nothing was enqueued (use a new id for different work)"
        )


class ResultNotAvailable(QuickError, LookupError):
    """No result to return: the item is not finished (``pending``: worth waiting for),
    kept none, or its record expired."""

    def __init__(self, item_id: str, reason: str, *, pending: bool = False) -> None:
        self.item_id = item_id
        self.reason = reason
        self.pending = pending
        super().__init__(f"no result for item {item_id!r}: {reason}")


# A result waiter's reads: the first after 50 ms, each wait twice the last, up to 1 s.
RESULT_POLL_FIRST_S = 0.05
RESULT_POLL_MAX_S = 1.0


class ResultWait:
    """When a caller waiting ``timeout_s`` for a result reads again: one schedule for
    ``Quick``, ``AsyncQuick`` and the HTTP clients. A read is one snapshot read (no
    conflict with anything); backing off to 1 s keeps a long wait to about one a second."""

    def __init__(
        self,
        timeout_s: float,
        *,
        first_s: float = RESULT_POLL_FIRST_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._monotonic = monotonic
        self.deadline = monotonic() + timeout_s
        self.delay = first_s

    def sleep_after(self, missing: ResultNotAvailable) -> float:
        """The seconds to sleep before reading again, after a read raised ``missing``;
        raises ``missing`` when there is nothing to wait for (the item is not pending)
        or the time is up."""
        left = self.deadline - self._monotonic()
        if not missing.pending or left <= 0:
            raise missing
        sleep = min(self.delay, left)
        self.delay = min(RESULT_POLL_MAX_S, self.delay * 2)
        return sleep


@dataclass(frozen=True, slots=True)
class Policy:
    """How long a finished item's record is kept, in ms (0: not at all)."""

    status_ms: int = 0
    result_ms: int = 0
    dedupe_ms: int = 0

    def wanted(self) -> bool:
        return bool(self.status_ms or self.result_ms or self.dedupe_ms)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished item's record."""

    state: str
    finished_ms: int
    attempts: int
    error_count: int
    digest: str
    expires_ms: int
    dedupe_until_ms: int
    result_until_ms: int
    result: bytes | None = None
    content_type: str = "bytes"
    reason: str | None = None  # why it was dead-lettered, or why no result was kept
    job_type: str | None = None  # None in records written before it was kept
    progress: list[Any] | None = None  # the handler's last progress (store/progress.py)


def payload_digest(payload: bytes, content_type: str) -> str:
    """Compares payloads without storing them: 64 bits of BLAKE2b over type and bytes."""
    return hashlib.blake2b(content_type.encode() + b"\x00" + payload, digest_size=8).hexdigest()


def policy_meta(policy: Policy, payload: bytes, content_type: str) -> dict[str, Any]:
    """The item metadata the enqueue stores so the finishing transaction knows the policy."""
    return {
        POLICY_KEY: [
            policy.status_ms,
            policy.result_ms,
            policy.dedupe_ms,
            payload_digest(payload, content_type),
        ]
    }


def encode_result(value: Any) -> tuple[bytes | None, str, str | None]:
    """(bytes, content type, why not stored): bytes as they are, anything else as JSON,
    never pickle; a value over :data:`MAX_RESULT_BYTES` or not JSON is not stored."""
    if isinstance(value, bytes | bytearray | memoryview):
        body, ctype = bytes(value), "bytes"
    else:
        try:
            body = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as err:
            return None, "bytes", f"result not stored: not bytes or JSON ({err})"
        ctype = "json"
    if len(body) > MAX_RESULT_BYTES:
        why = (
            f"result not stored: {len(body)} bytes > {MAX_RESULT_BYTES}, the most a kept "
            f"result holds (store it elsewhere and return where)"
        )
        return None, ctype, why
    return body, ctype, None


def decode_result(outcome: Outcome) -> Any:
    if outcome.result is None:
        return None
    if outcome.content_type == "json":
        return json.loads(outcome.result)
    return outcome.result


def finished(
    tr: KVTransaction,
    keys: KeySpace,
    zone: ZoneId,
    item: WorkItem,
    state: str,
    now_ms: int,
    *,
    result: Any = None,
    reason: str | None = None,
    run_ended: bool = False,
) -> str | None:
    """The hook the completing, cancelling or dead-lettering transaction calls, in ``tr``:
    releases the flow key the item holds (:func:`flow_keys.release`: a snapshot read, but
    for a one-at-a-time key), and writes the outcome record and its expiry entry if the
    item's type asked for one. Adds no read conflict to the finishing transaction of an
    item without a one-at-a-time key. ``run_ended``: the record of an at-most-once item
    written after its run (it was deleted, "completed", when taken). Returns the id of the
    item a one-at-a-time key passed to: the caller makes it visible (its order entry)."""
    turn = flow_keys.release(tr, keys, zone, item, state, now_ms, run_ended=run_ended)
    raw = item.meta.get(POLICY_KEY)
    if not raw:
        return turn
    status_ms, result_ms, dedupe_ms, digest = int(raw[0]), int(raw[1]), int(raw[2]), str(raw[3])
    body: bytes | None = None
    ctype = "bytes"
    if state == COMPLETED and result_ms > 0 and result is not None:
        body, ctype, why = encode_result(result)
        if why is not None:
            # The item completes (its handler's effects happened; running it again would
            # repeat them), but its result is refused: said here, where the completion is
            # written, and by q.result() for as long as the status is kept.
            log.warning(
                "result of job type %r item %s in %s refused: %s",
                item.job_type,
                item.item_id,
                zone,
                why,
                extra={"quick_event": "result_refused"},
            )
            reason = why
    expires = now_ms + max(status_ms, result_ms, dedupe_ms)
    record = {
        "v": 1,
        "st": state,
        "at": now_ms,
        "a": item.attempts,
        "e": item.error_count,
        "h": digest,
        "x": expires,
        "du": now_ms + dedupe_ms,
        "ru": now_ms + result_ms if body is not None else 0,
        "r": body,
        "ct": ctype,
        "why": reason,
        "j": item.job_type,
    }
    if PROGRESS_KEY in item.meta:
        record[PROGRESS_KEY] = item.meta[PROGRESS_KEY]
    tr.set(keys.outcome_key(zone, item.item_id), msgpack.packb(record, use_bin_type=True))
    tr.set(keys.outcome_expiry_key(expires, zone, item.item_id), b"")
    return turn


def _decode(key: bytes, raw: bytes) -> Outcome:
    try:
        d = msgpack.unpackb(raw, raw=False)
        return Outcome(
            state=str(d["st"]),
            finished_ms=int(d["at"]),
            attempts=int(d["a"]),
            error_count=int(d["e"]),
            digest=str(d["h"]),
            expires_ms=int(d["x"]),
            dedupe_until_ms=int(d["du"]),
            result_until_ms=int(d["ru"]),
            result=d.get("r"),
            content_type=str(d.get("ct", "bytes")),
            reason=d.get("why"),
            job_type=d.get("j"),
            progress=d.get(PROGRESS_KEY),
        )
    except Exception as err:  # msgpack and a missing field raise unrelated types
        raise CorruptRecord(key, f"outcome record: {err}") from err


def read(
    tr: KVTransaction,
    keys: KeySpace,
    zone: ZoneId,
    item_id: str,
    now_ms: int,
    *,
    snapshot: bool = False,
) -> Outcome | None:
    """The item's live outcome record in ``tr`` (None when absent or expired: an expired
    record not yet collected reads as gone)."""
    key = keys.outcome_key(zone, item_id)
    raw = tr.get(key, snapshot=snapshot)
    if raw is None:
        return None
    outcome = _decode(key, raw)
    return outcome if outcome.expires_ms > now_ms else None


def check_duplicate(
    tr: KVTransaction,
    keys: KeySpace,
    zone: ZoneId,
    item_id: str,
    payload: bytes,
    content_type: str,
    now_ms: int,
    job_type: str | None = None,
) -> str | None:
    """Part one's dedupe check, in the caller's transaction: the state of an item of this
    id finished within its dedupe window (the enqueue is then a no-op), else None.

    A conflicting read of the outcome key: an enqueue racing the completion that writes it
    retries and sees it, so one of "still queued" or "finished" is always observed.
    Raises :class:`DuplicateItemMismatch` when the job type or the payload differs."""
    outcome = read(tr, keys, zone, item_id, now_ms)
    if outcome is None or outcome.dedupe_until_ms <= now_ms:
        return None
    if job_type is not None and outcome.job_type not in (None, job_type):
        raise DuplicateItemMismatch(str(zone), item_id, outcome.state, "job type")
    if outcome.digest != payload_digest(payload, content_type):
        raise DuplicateItemMismatch(str(zone), item_id, outcome.state)
    return outcome.state


def collect_expired(
    tr: KVTransaction,
    keys: KeySpace,
    now_ms: int,
    limit: int = GC_BATCH,
    *,
    take_turn: flow_key_lapses.TakeTurn | None = None,
) -> int:
    """Clear up to ``limit`` expired records from the start of the expiry index, and as
    many expired flow key holds (:func:`flow_key_lapses.collect_expired`: a lapsed one-at-a-time
    hold passes its key on, ``take_turn`` making the next item visible), in ``tr``;
    returns how many entries it cleared. A record rewritten since (the id ran again) has a
    later expiry: only its stale index entry goes."""
    held = flow_key_lapses.collect_expired(tr, keys, now_ms, limit, take_turn)
    begin, end = keys.outcome_expiry_range(now_ms)
    rows = tr.get_range(begin, end, limit=limit)
    for index_key, _ in rows:
        expires, app, tenant, item_id = keys.unpack_outcome_expiry_key(index_key)
        zone = ZoneId(app, tenant)
        key = keys.outcome_key(zone, item_id)
        raw = tr.get(key)
        if raw is not None:
            try:
                stale = _decode(key, raw).expires_ms <= expires
            except CorruptRecord:
                stale = True
            if stale:
                tr.clear(key)
        tr.clear(index_key)
    return len(rows) + held


def collect_expired_outcomes(
    kv: KVStore,
    keys: KeySpace,
    now_ms: int,
    limit: int = GC_BATCH,
    *,
    max_batches: int = GC_MAX_BATCHES,
    take_turn: flow_key_lapses.TakeTurn | None = None,
) -> int:
    """The maintenance step: clear records expired by ``now_ms``, ``limit`` per
    transaction of their own, until none is left or ``max_batches`` ran; returns how many
    expiry index entries it cleared. ``take_turn``: the zone store's, for one-at-a-time
    keys whose at-most-once holder's run lapsed (:func:`flow_key_lapses.collect_expired`).

    Reads only the start of the expiry index (what has expired) and those records, never
    a tenant's zone (but for a corrupt one-at-a-time record met there, whose holder only
    its zone names), and never a record that is kept: its cost follows what expired, not
    how many tenants there are. Safe in several processes at once: two collectors of one
    batch conflict and the retry moves on to what is left. A consumer's maintenance calls
    it every :data:`COLLECT_EVERY_S` seconds (``Quick.collect_outcomes`` is one batch).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument("limit", limit, "must be a positive integer")
    if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise InvalidArgument("max_batches", max_batches, "must be a positive integer")
    total = 0
    for _ in range(max_batches):
        cleared = run(
            kv, lambda tr: collect_expired(tr, keys, now_ms, limit, take_turn=take_turn)
        )
        total += cleared
        if cleared < limit:
            break
    return total


QUEUED = "queued"
LEASED = "leased"


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What became of an item, and when.

    ``state``: "queued", "leased" (a consumer holds it: running, or about to),
    "completed", "cancelled", "dead_lettered" or "failed" (an at-most-once item whose
    handler raised: it is not run again). ``at_ms``: when it was enqueued (queued,
    leased) or finished. ``next_vesting_ms``: when a queued item vests, or a leased item's
    lease ends (it becomes visible again then unless completed)."""

    state: str
    at_ms: int
    attempts: int
    error_count: int
    next_vesting_ms: int | None = None
    last_error: str | None = None
    has_result: bool = False
    progress: float | None = None  # the handler's last ctx.progress (0..1), if any
    progress_note: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in (COMPLETED, CANCELLED, DEAD_LETTERED, FAILED)


def live_status(item: WorkItem) -> JobStatus:
    return JobStatus(
        state=LEASED if item.lease_id is not None else QUEUED,
        at_ms=item.enqueued_ms,
        attempts=item.attempts,
        error_count=item.error_count,
        next_vesting_ms=item.vesting_ms,
        last_error=item.last_error,
        **_progress_fields(item.meta),
    )


def _progress_fields(meta: dict[str, Any] | None) -> dict[str, Any]:
    kept = progress_of(meta)
    return {} if kept is None else {"progress": kept.fraction, "progress_note": kept.note}


class _DeadLetters(Protocol):
    def read_dead_letter(
        self, zone: ZoneId, item_id: str, *, snapshot: bool = False, tr: KVTransaction = ...
    ) -> DeadLetter | None: ...


def finished_status(
    kv: KVStore,
    keys: KeySpace,
    dead_letters: _DeadLetters,
    zone: ZoneId,
    item_id: str,
    now_ms: int,
) -> JobStatus | None:
    """A finished item's status from its outcome record, else its dead letter (kept for
    every type until purged), in one snapshot."""

    def read_both(tr: KVTransaction) -> JobStatus | None:
        outcome = read(tr, keys, zone, item_id, now_ms, snapshot=True)
        if outcome is not None:
            return JobStatus(
                state=outcome.state,
                at_ms=outcome.finished_ms,
                attempts=outcome.attempts,
                error_count=outcome.error_count,
                last_error=outcome.reason if outcome.state in (DEAD_LETTERED, FAILED) else None,
                has_result=outcome.result is not None and outcome.result_until_ms > now_ms,
                **_progress_fields({PROGRESS_KEY: outcome.progress}),
            )
        letter = dead_letters.read_dead_letter(zone, item_id, snapshot=True, tr=tr)
        if letter is None:
            return None
        item = letter.item
        return JobStatus(
            state=DEAD_LETTERED,
            at_ms=letter.dead_at_ms,
            attempts=0 if item is None else item.attempts,
            error_count=0 if item is None else item.error_count,
            last_error=letter.reason,
            **_progress_fields(None if item is None else item.meta),
        )

    return run(kv, read_both)


class _Items(Protocol):
    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None: ...


def read_result(
    kv: KVStore, keys: KeySpace, items: _Items, zone: ZoneId, item_id: str, now_ms: int
) -> Any:
    """A completed item's kept result, or :class:`ResultNotAvailable` saying why not.

    The live item is read before the outcome: a completion writes the outcome and deletes
    the item in one transaction, so an item already gone has its outcome visible to the
    later read. The other order calls an item completing between the reads unknown."""
    live = items.get(zone, item_id)
    if live is not None:
        state = live_status(live).state
        raise ResultNotAvailable(item_id, f"not finished yet ({state})", pending=True)
    outcome = run(kv, lambda tr: read(tr, keys, zone, item_id, now_ms, snapshot=True))
    if outcome is None:
        raise ResultNotAvailable(item_id, "unknown item, or its record expired")
    if outcome.state != COMPLETED:
        raise ResultNotAvailable(item_id, f"it was {outcome.state.replace('_', '-')}")
    if outcome.result is None:
        raise ResultNotAvailable(item_id, outcome.reason or "its job type keeps no result")
    if outcome.result_until_ms <= now_ms:
        raise ResultNotAvailable(item_id, "its result expired")
    return decode_result(outcome)
