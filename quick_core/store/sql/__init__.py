"""Zones native in SQL (docs/backends.md, "Zones native in SQL: the design"): items and
pointers in tables of their own beside the KV table, written by statements instead of
KV transactions, on stores that run SQL (``sqlite:///path?zones=sql``). The zone store
(:class:`SQLZoneStore`) and the top-level queue (:class:`SQLTopLevelQueue`) keep every
paper rule of the KV ones; what they cannot do yet is absent from their capabilities.
"""

from __future__ import annotations

from quickzones.store.kv import KVStore
from quickzones.store.sql.connections import SQLConnections, SQLTransaction
from quickzones.store.sql.statements import Statements, statements
from quickzones.store.sql.toplevel import SQLTopLevelQueue
from quickzones.store.sql.zones import SQLZoneStore

__all__ = [
    "SQLConnections",
    "SQLTopLevelQueue",
    "SQLTransaction",
    "SQLZoneStore",
    "Statements",
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
