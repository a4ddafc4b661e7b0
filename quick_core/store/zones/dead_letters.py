"""Dead letters: an item moved out of its zone (failed past its retries, expired, corrupt)
in one transaction, read back, requeued or dropped."""

from __future__ import annotations

from quickzones.clock import now_ms
from quickzones.errors import (
    CorruptRecord,
    ItemAlreadyQueued,
    ItemNotFound,
)
from quickzones.store import batches, dead_groups, outcomes
from quickzones.store.kv import (
    OWN_STORE,
    KVTransaction,
    pack_i64,
    run,
    transactional,
)
from quickzones.store.records import (
    DeadLetter,
    WorkItem,
    ZoneId,
    dead_letter_chunks,
    decode_dead_letter,
    encode_dead_letter,
    encode_item,
)
from quickzones.store.zones.items import (
    CHUNK_SIZE,
    INLINE_PAYLOAD_LIMIT,
    ZoneItems,
    lease_lost,
)
from quickzones.store.zonestore import NewItem


class ZoneDeadLetters(ZoneItems):
    def _bury(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item: WorkItem,
        reason: str,
        *,
        count_error: bool = False,
        traceback: str | None = None,
    ) -> None:
        """Move an item out of its zone into the dead-letter store, in ``tr``.

        ``count_error``: the run that failed counts as an error (error count + 1, last error
        = ``reason``), so a dead letter's error count agrees with its attempts.
        """
        self._delete_item(tr, zone, item)
        stored = _letter_of(item, reason, count_error)
        turn = outcomes.finished(
            tr, self.keys, zone, stored, outcomes.DEAD_LETTERED, now_ms(self.clock), reason=reason
        )
        self.take_turn(tr, zone, turn)
        batches.item_finished(tr, self._batches(), zone, stored, outcomes.DEAD_LETTERED, reason)
        self._letter(tr, zone, stored, reason, traceback)

    def _letter(
        self, tr: KVTransaction, zone: ZoneId, stored: WorkItem, reason: str, traceback: str | None
    ) -> None:
        """The dead letter of ``stored`` (as :func:`_letter_of` made it), its whole record
        kept, counted in its job type's group."""
        self._dead_letter_raw(
            tr,
            zone,
            stored.item_id,
            encode_item(stored),
            reason,
            now_ms(self.clock),
            traceback=traceback,
            job_type=stored.job_type,
        )

    def keep_dead_letter(
        self,
        zone: ZoneId,
        item: WorkItem,
        reason: str,
        *,
        count_error: bool = False,
        traceback: str | None = None,
    ) -> None:
        """Write the dead letter of ``item``, an item of another zone store (the native
        SQL zones keep their dead letters here, where ``quick dead-letters`` and the
        admin read them), in a transaction of its own; that store deletes the item after.
        ``count_error`` as :meth:`_bury`'s."""
        stored = _letter_of(item, reason, count_error)
        run(self.kv, lambda tr: self._letter(tr, zone, stored, reason, traceback))

    def keep_corrupt_letter(self, zone: ZoneId, item_id: str, raw: bytes, reason: str) -> None:
        """Write the dead letter of another store's record that cannot be decoded."""
        now = now_ms(self.clock)
        run(self.kv, lambda tr: self._dead_letter_raw(tr, zone, item_id, raw, reason, now))

    def _dead_letter_raw(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item_id: str,
        raw: bytes,
        reason: str,
        now: int,
        *,
        traceback: str | None = None,
        job_type: str | None = None,
    ) -> None:
        """Write a dead letter keeping the whole item record ``raw``: inline when small,
        else split across chunk keys as a large item's payload is (a 1 MiB payload does not
        fit in one value). Counted in its group (``job_type``, None for a corrupt record),
        a letter of the same id it replaces taken out of its own."""
        key = self.keys.dead_letter_key(zone, item_id)
        if tr.get(key, snapshot=True) is not None:  # rare: the id was dead-lettered before
            replaced = self.read_dead_letter(zone, item_id, snapshot=True, tr=tr)
            if replaced is not None:
                dead_groups.add(
                    tr, self.keys, zone, item_id, dead_groups.letter_group(replaced), -1
                )
        dead_groups.add(tr, self.keys, zone, item_id, dead_groups.group_of(job_type, reason), 1)
        # A letter of the same id written earlier may have more chunks: clear them all.
        tr.clear_range(*self.keys.dead_letter_range_of(zone, item_id))
        if len(raw) <= INLINE_PAYLOAD_LIMIT:
            tr.set(key, encode_dead_letter(reason, now, raw, traceback=traceback))
            return
        chunks = [raw[i : i + CHUNK_SIZE] for i in range(0, len(raw), CHUNK_SIZE)]
        tr.set(key, encode_dead_letter(reason, now, None, chunks=len(chunks), traceback=traceback))
        for n, chunk in enumerate(chunks):
            tr.set(self.keys.dead_letter_chunk_key(zone, item_id, n), chunk)

    @transactional
    def read_dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        *,
        snapshot: bool = False,
        tr: KVTransaction = OWN_STORE,
    ) -> DeadLetter | None:
        """One dead letter with its chunks, read in one transaction."""
        key = self.keys.dead_letter_key(zone, item_id)
        raw = tr.get(key, snapshot=snapshot)
        if raw is None:
            return None
        chunks: list[bytes] | None = None
        n = dead_letter_chunks(key, raw)
        if n:
            begin = self.keys.dead_letter_chunk_key(zone, item_id, 0)
            end = self.keys.dead_letter_chunk_key(zone, item_id, n)
            chunks = [v for _, v in tr.get_range(begin, end, snapshot=snapshot)]
        return decode_dead_letter(key, raw, zone, item_id, chunks)

    @transactional
    def take_dead_letter(
        self, zone: ZoneId, item_id: str, *, tr: KVTransaction = OWN_STORE
    ) -> NewItem:
        """Remove a dead letter and return its item, with a clean error count, for the
        caller to enqueue in the same transaction (``tr=tr``): both happen or neither.

        Raises :class:`ItemNotFound` without a dead letter, :class:`ItemAlreadyQueued` when
        the zone holds an item of the same id (nothing changes then), and
        :class:`CorruptRecord` for a dead letter whose item cannot be decoded.
        """
        item = self.dead_letter_item(zone, item_id, tr=tr)
        if self._exists(tr, zone, item_id):
            # An enqueue would treat the id as an idempotent repeat and store nothing.
            raise ItemAlreadyQueued(str(zone), item_id)
        self.drop_dead_letter(zone, item_id, tr=tr)
        return item

    @transactional
    def dead_letter_item(
        self, zone: ZoneId, item_id: str, *, tr: KVTransaction = OWN_STORE
    ) -> NewItem:
        """A dead letter's item as an enqueue takes it, with a clean error count (the
        letter stays): :class:`ItemNotFound` without one, :class:`CorruptRecord` when its
        item cannot be decoded."""
        letter = self.read_dead_letter(zone, item_id, tr=tr)
        if letter is None:
            raise ItemNotFound(item_id)
        if letter.item is None:
            raise CorruptRecord(
                self.keys.dead_letter_key(zone, item_id),
                "the dead item's record is corrupt; it cannot be requeued",
            )
        item = letter.item
        return NewItem(
            job_type=item.job_type,
            payload=item.payload,
            priority=item.priority,
            item_id=item.item_id,
            content_type=item.content_type,
            delivery=item.delivery,
            meta={k: v for k, v in item.meta.items() if k != "_chunks"},
        )

    @transactional
    def drop_dead_letter(
        self, zone: ZoneId, item_id: str, *, tr: KVTransaction = OWN_STORE
    ) -> None:
        """Remove a dead letter (with its chunks), counted out of its group; nothing when
        it is gone already."""
        letter = self.read_dead_letter(zone, item_id, tr=tr)
        if letter is None:
            return
        tr.clear_range(*self.keys.dead_letter_range_of(zone, item_id))
        dead_groups.add(tr, self.keys, zone, item_id, dead_groups.letter_group(letter), -1)

    @transactional
    def dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        *,
        traceback: str | None = None,
        tr: KVTransaction = OWN_STORE,
    ) -> None:
        """Dead-letter an item. With ``lease_id`` its holder's run failed: that attempt
        counts as an error (error count + 1, last error = ``reason``), so the dead letter's
        error count agrees with its attempts; without one (an operator's decision) the
        counts are kept as they are."""
        item = self._read_item(tr, zone, item_id)
        if item is None:
            raise ItemNotFound(item_id)
        if lease_id is not None and item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now_ms(self.clock))
        self._bury(tr, zone, item, reason, count_error=lease_id is not None, traceback=traceback)

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        def drop(tr: KVTransaction) -> None:
            key = self.keys.item_key(zone, item_id)
            raw = tr.get(key)
            if raw is None:
                return
            self._dead_letter_raw(tr, zone, item_id, raw, "corrupt record", now_ms(self.clock))
            tr.clear_range(*self.keys.items_range_of(zone, item_id))
            tr.add(self.keys.count_key(zone), pack_i64(-1))

        run(self.kv, drop)


def _letter_of(item: WorkItem, reason: str, count_error: bool) -> WorkItem:
    """``item`` as its dead letter keeps it: unleased, its chunks' count dropped; with
    ``count_error`` the failed run counted (error count + 1, last error ``reason``)."""
    stored = item.with_(
        lease_id=None,
        commit_order=None,
        meta={k: v for k, v in item.meta.items() if k != "_chunks"},
    )
    if count_error:
        stored = stored.with_(error_count=item.error_count + 1, last_error=reason)
    return stored
