"""A running item's progress (issue 31 point 4): what a handler reported with
``ctx.progress(fraction, note)``.

Progress is kept in the item's own record (metadata key ``_p``: fraction, note, store
time), the record a status read already reads: ``Quick.status`` of a live item shows it,
and the completing, cancelling or dead-lettering transaction, which reads the record,
copies it into the outcome record (:func:`quickzones.store.outcomes.finished`), so it is
kept with the status record after completion at no extra read. Only the lease holder
writes it (:meth:`ProgressStore.record_progress` checks the lease id).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from quickzones.errors import InvalidArgument
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId

PROGRESS_KEY = "_p"
MAX_NOTE_CHARS = 500


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float
    note: str | None
    at_ms: int


def check_progress(fraction: object, note: object) -> tuple[float, str | None]:
    """A fraction from 0 to 1 and an optional short text note, or InvalidArgument."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise InvalidArgument("progress", fraction, "must be a number between 0 and 1")
    value = float(fraction)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidArgument("progress", fraction, "must be between 0 and 1")
    if note is not None:
        if not isinstance(note, str):
            raise InvalidArgument("progress note", note, "must be text or None")
        if len(note) > MAX_NOTE_CHARS:
            raise InvalidArgument("progress note", note, f"longer than {MAX_NOTE_CHARS} characters")
    return value, note


def progress_value(fraction: float, note: str | None, at_ms: int) -> list[Any]:
    """What the item record's metadata keeps (msgpack)."""
    return [fraction, note, at_ms]


def progress_of(meta: Mapping[str, Any] | None) -> Progress | None:
    """The progress kept in an item's metadata or an outcome record, if any."""
    raw = None if meta is None else meta.get(PROGRESS_KEY)
    if not raw:
        return None
    return Progress(float(raw[0]), None if raw[1] is None else str(raw[1]), int(raw[2]))


@runtime_checkable
class ProgressStore(Protocol):
    """A zone store that keeps progress (the KV zones)."""

    def record_progress(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        fraction: float,
        note: str | None,
        *,
        tr: KVTransaction = ...,
    ) -> None: ...
