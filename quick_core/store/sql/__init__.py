"""Zones native in SQL (docs/backends.md, "Zones native in SQL: the design"): items and
pointers in tables of their own beside the KV table, written by statements instead of
KV transactions, on stores that run SQL (``sqlite:///path?zones=sql``). The zone store
(:class:`SQLZoneStore`) and the top-level queue (:class:`SQLTopLevelQueue`) keep every
paper rule of the KV ones; what they cannot do yet is absent from their capabilities.
"""

from __future__ import annotations

from typing import cast

from quickzones.errors import ConfigurationError
from quickzones.store.kv import KVStore
from quickzones.store.sql.connections import SQLConnections, SQLTransaction
from quickzones.store.sql.statements import Statements, statements
from quickzones.store.sql.toplevel import SQLTopLevelQueue
from quickzones.store.sql.zones import SQLZoneStore
from quickzones.store.toplevel import TopLevelQueue

__all__ = [
    "SQLConnections",
    "SQLTopLevelQueue",
    "SQLTransaction",
    "SQLZoneStore",
    "Statements",
    "ZoneLayoutMismatch",
    "check_zone_layout",
    "native_sql",
    "statements",
]


def native_sql(kv: KVStore) -> SQLConnections | None:
    """``kv`` as the native zones' SQL seam where it keeps zones in SQL tables (opened
    with ``zones=sql``), else None."""
    if getattr(kv, "zones", "kv") != "sql":
        return None
    sql: SQLConnections = kv  # type: ignore[assignment]
    return sql


class ZoneLayoutMismatch(ConfigurationError):
    """A store opened with one zone layout holds queued work in the other: its items
    would never run (nothing is migrated between them yet)."""


def check_zone_layout(kv: KVStore, root: str, toplevel: TopLevelQueue) -> None:
    """Refuse to open a store whose queued work lives in the other layout than the one
    asked for: ``zones=sql`` over pointers in the KV layout, or the KV layout over
    pointers in the SQL tables (their items would wait unseen)."""
    sql = native_sql(kv)
    if sql is not None:
        kv_list = TopLevelQueue.list_pointers  # the KV queue's, not the SQL one's
        if any(kv_list(toplevel, shard, limit=1) for shard in range(toplevel.shards)):
            raise ZoneLayoutMismatch(
                f"{getattr(kv, 'url', kv)} holds queued work in the KV layout, which "
                "zones=sql does not read: open it without zones=sql until that work is done"
            )
        return
    runs_sql = cast(SQLConnections | None, kv if hasattr(kv, "sql_read") else None)
    if runs_sql is None:
        return
    q = statements(root, runs_sql.sql_dialect, runs_sql.sql_namespace)
    with runs_sql.sql_read() as c:
        if c.execute(q.table_exists, {"table": q.pointers_table}).fetchone() is None:
            return
        if c.execute(f"SELECT 1 FROM {q.pointers_table} LIMIT 1").fetchone() is None:
            return
    raise ZoneLayoutMismatch(
        f"{getattr(kv, 'url', kv)} holds queued work in SQL tables (zones=sql): open it "
        "with zones=sql in the URL"
    )
