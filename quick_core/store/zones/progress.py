"""Progress in the item's record (:mod:`quickzones.store.progress`): the KV zones' part."""

from __future__ import annotations

from quickzones.clock import now_ms
from quickzones.store.kv import OWN_STORE, KVTransaction, transactional
from quickzones.store.progress import PROGRESS_KEY, check_progress, progress_value
from quickzones.store.records import ZoneId
from quickzones.store.zones.leases import ZoneLeases


class ZoneProgress(ZoneLeases):
    @transactional
    def record_progress(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        fraction: float,
        note: str | None,
        *,
        tr: KVTransaction = OWN_STORE,
    ) -> None:
        """Keep ``fraction`` and ``note`` in the item's record; only its lease holder may
        (``LeaseLost``, ``ItemNotFound`` otherwise). Inside a transactional handler's
        ``tr`` the completion that follows reads it back and keeps it."""
        fraction, note = check_progress(fraction, note)
        item = self._check_holder(self._read_item(tr, zone, item_id), item_id, lease_id)
        kept = progress_value(fraction, note, now_ms(self.clock))
        self._rewrite_header(tr, zone, item, item.with_(meta={**item.meta, PROGRESS_KEY: kept}))
