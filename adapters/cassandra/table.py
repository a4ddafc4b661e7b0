"""The zone table's statements and how they run, for :class:`CassandraZoneStore`.

Reads at the configured consistency (or SERIAL), unconditional single-partition batches,
conditional batches whose unknown outcome is reported as such, and the row <-> item
conversion. What the statements mean for a queue zone is the store's business.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack

from quickzones.adapters.cassandra.driver import (
    CassandraError,
    consistency_level,
    definitely_not_applied,
    driver_errors,
    read_error,
    require_driver,
)
from quickzones.adapters.cassandra.schema import ITEM_COLUMNS
from quickzones.errors import CorruptRecord
from quickzones.store.records import WorkItem, ZoneId

log = logging.getLogger("quick.cassandra")


class ZoneTable:
    """Prepared statements on one zone table, and their execution."""

    def __init__(
        self,
        session: Any,
        keyspace: str,
        table: str,
        *,
        consistency: str = "QUORUM",
        serial_consistency: str = "SERIAL",
        timeout_s: float = 10.0,
    ) -> None:
        require_driver()
        self.session = session
        self.keyspace = keyspace
        self.table = table
        self.timeout_s = timeout_s
        self.cl = consistency_level(consistency)
        self.serial = consistency_level(serial_consistency)
        self.errors = driver_errors()
        self._prepare()

    # --- statements --------------------------------------------------------------------

    def _prepare(self) -> None:
        t = f"{self.keyspace}.{self.table}"
        cols = ", ".join(ITEM_COLUMNS)
        marks = ", ".join("?" for _ in ITEM_COLUMNS)
        item_pk = "app = ? AND tenant = ? AND kind = 1 AND o_priority = 0 AND o_vesting = 0"
        order_pk = "app = ? AND tenant = ? AND kind = 0 AND o_priority = ? AND o_vesting = ?"
        p = self.session.prepare
        self.sel_item = p(f"SELECT item_id, {cols} FROM {t} WHERE {item_pk} AND item_id = ?")
        self.sel_items = p(f"SELECT item_id, {cols} FROM {t} WHERE {item_pk} AND item_id IN ?")
        self.sel_zone_items = p(
            f"SELECT item_id, {cols} FROM {t} WHERE app = ? AND tenant = ? AND kind = 1"
        )
        self.sel_vested = p(
            f"SELECT o_priority, o_vesting, item_id FROM {t} WHERE app = ? AND tenant = ? "
            "AND kind = 0 AND o_priority = ? AND o_vesting <= ? LIMIT ?"
        )
        self.sel_next_priority = p(
            f"SELECT o_priority, o_vesting FROM {t} WHERE app = ? AND tenant = ? "
            "AND kind = 0 AND o_priority >= ? LIMIT 1"
        )
        self.sel_any_item = p(
            f"SELECT item_id FROM {t} WHERE app = ? AND tenant = ? AND kind = 1 LIMIT 1"
        )
        self.sel_count = p(f"SELECT COUNT(*) FROM {t} WHERE app = ? AND tenant = ? AND kind = 1")
        self.sel_zones = p(f"SELECT DISTINCT app, tenant FROM {t}")
        self.sel_dead = p(
            f"SELECT item_id, {cols}, dead_reason, dead_at_ms FROM {t} "
            "WHERE app = ? AND tenant = ? AND kind = 2"
        )
        self.ins_item_nx = p(
            f"INSERT INTO {t} (app, tenant, kind, o_priority, o_vesting, item_id, {cols}) "
            f"VALUES (?, ?, 1, 0, 0, ?, {marks}) IF NOT EXISTS"
        )
        self.ins_order = p(
            f"INSERT INTO {t} (app, tenant, kind, o_priority, o_vesting, item_id) "
            "VALUES (?, ?, 0, ?, ?, ?)"
        )
        self.del_order = p(f"DELETE FROM {t} WHERE {order_pk} AND item_id = ?")
        self.upd_item_if = p(
            f"UPDATE {t} SET vesting_ms = ?, lease_id = ?, attempts = ?, error_count = ?, "
            f"last_error = ?, meta = ? WHERE {item_pk} AND item_id = ? "
            "IF lease_id = ? AND vesting_ms = ?"
        )
        self.del_item_if = p(
            f"DELETE FROM {t} WHERE {item_pk} AND item_id = ? IF lease_id = ? AND vesting_ms = ?"
        )
        self.del_item = p(f"DELETE FROM {t} WHERE {item_pk} AND item_id = ?")
        self.ins_dead = p(
            f"INSERT INTO {t} (app, tenant, kind, o_priority, o_vesting, item_id, {cols}, "
            f"dead_reason, dead_at_ms) VALUES (?, ?, 2, 0, 0, ?, {marks}, ?, ?)"
        )
        self.del_dead = p(
            f"DELETE FROM {t} WHERE app = ? AND tenant = ? AND kind = 2 AND o_priority = 0 "
            "AND o_vesting = 0 AND item_id = ?"
        )

    # --- execution ---------------------------------------------------------------------

    def read(
        self, stmt: Any, params: tuple[Any, ...], *, serial: bool = False, fetch_size: int = 0
    ) -> list[Any]:
        """All rows of a read at QUORUM (or SERIAL); any failure raises CassandraError, so
        a caller never mistakes an unreachable store for an empty zone."""
        bound = stmt.bind(params)
        bound.consistency_level = self.serial if serial else self.cl
        if fetch_size:
            bound.fetch_size = fetch_size
        try:
            return list(self.session.execute(bound, timeout=self.timeout_s))
        except self.errors as err:
            raise read_error(err, "read") from err

    def write(self, statements: Sequence[tuple[Any, tuple[Any, ...]]]) -> None:
        """Unconditional writes in one single-partition batch (atomic, no batchlog)."""
        batch = self.batch(statements)
        try:
            self.session.execute(batch, timeout=self.timeout_s)
        except self.errors as err:
            raise CassandraError(
                f"Cassandra write failed: {type(err).__name__}: {err}",
                outcome_unknown=not definitely_not_applied(err),
            ) from err

    def batch(self, statements: Sequence[tuple[Any, tuple[Any, ...]]]) -> Any:
        BatchStatement = require_driver().query.BatchStatement

        batch = BatchStatement(consistency_level=self.cl, serial_consistency_level=self.serial)
        for stmt, params in statements:
            batch.add(stmt, params)
        return batch

    def cas(self, statements: Sequence[tuple[Any, tuple[Any, ...]]]) -> bool | None:
        """Run a conditional batch: True applied, False refused, None outcome unknown."""
        batch = self.batch(statements)
        try:
            result = self.session.execute(batch, timeout=self.timeout_s)
        except self.errors as err:
            if definitely_not_applied(err):
                raise CassandraError(f"Cassandra unavailable: {type(err).__name__}: {err}") from err
            log.info("conditional write outcome unknown (%s); re-reading at SERIAL", err)
            return None
        return bool(result.was_applied)

    # --- rows <-> items ----------------------------------------------------------------

    def row_key(self, zone: ZoneId, item_id: str) -> bytes:
        return f"cassandra:{self.keyspace}/{zone}/{item_id}".encode()

    def to_item(self, zone: ZoneId, row: Any) -> WorkItem:
        try:
            meta = msgpack.unpackb(row.meta, raw=False) if row.meta else {}
            if not isinstance(meta, dict):
                raise TypeError("meta is not a map")
            held = bool(meta.pop(HELD_META, False))
            for name in ("job_type", "priority", "vesting_ms", "enqueued_ms"):
                if getattr(row, name) is None:
                    raise TypeError(f"{name} is null")
            return WorkItem(
                item_id=row.item_id,
                job_type=row.job_type,
                payload=row.payload or b"",
                priority=row.priority,
                vesting_ms=row.vesting_ms,
                enqueued_ms=row.enqueued_ms,
                error_count=row.error_count or 0,
                lease_id=row.lease_id or None,
                last_error=row.last_error,
                content_type=row.content_type or "bytes",
                deadline_ms=row.deadline_ms,
                delivery=row.delivery or "at_least_once",
                attempts=row.attempts or 0,
                meta=meta,
                held=held,
            )
        except (TypeError, ValueError, msgpack.ExtraData, msgpack.FormatError) as err:
            raise CorruptRecord(self.row_key(zone, row.item_id), str(err)) from err

    @staticmethod
    def fields(item: WorkItem) -> tuple[Any, ...]:
        """The item's columns in ITEM_COLUMNS order; no lease is stored as ''."""
        return (
            item.job_type,
            item.payload,
            item.priority,
            item.vesting_ms,
            item.enqueued_ms,
            item.error_count,
            item.lease_id or "",
            item.last_error,
            item.content_type,
            item.deadline_ms,
            item.delivery,
            item.attempts,
            _packed_meta(item),
        )

    def read_one(self, zone: ZoneId, item_id: str, *, serial: bool) -> WorkItem | None:
        rows = self.read(self.sel_item, (zone.app, zone.tenant, item_id), serial=serial)
        return self.to_item(zone, rows[0]) if rows else None

    def pages(self, stmt: Any, params: tuple[Any, ...], page_size: int, what: str) -> Iterator[Any]:
        """The rows of a read, fetched ``page_size`` at a time as they are consumed."""
        bound = stmt.bind(params)
        bound.consistency_level = self.cl
        bound.fetch_size = page_size
        try:
            yield from self.session.execute(bound, timeout=self.timeout_s)
        except self.errors as err:
            raise read_error(err, what) from err


# A held lease (WorkItem.held: leased to wait, its run not counted yet) rides in the row's
# metadata: the table has no column for it.
HELD_META = "_held"


def _packed_meta(item: WorkItem) -> bytes | None:
    meta = {**item.meta, HELD_META: True} if item.held else item.meta
    return msgpack.packb(meta, use_bin_type=True) if meta else None
