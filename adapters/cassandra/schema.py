"""The Cassandra schema: one table, one partition per zone.

Every row of a zone lives in the partition ``(app, tenant)``, told apart by ``kind``::

    kind 0  order entry   (kind, o_priority=priority, o_vesting=vesting, item_id)
    kind 1  item          (kind, 0, 0, item_id)   + the item's fields as columns
    kind 2  dead letter   (kind, 0, 0, item_id)   + the item's fields, reason, time

One partition and one table is what lets a lightweight transaction (a conditional batch)
move an item's order entry, change its lease and write its dead letter atomically:
Cassandra's conditional batches cannot span tables or partitions. Peek reads order entries
of one priority with ``o_vesting <= now``, so it never reads delayed or leased items.
"""

from __future__ import annotations

from typing import Any

from quickzones.errors import ConfigurationError

# Columns of item and dead-letter rows, in the order the prepared statements bind them.
ITEM_COLUMNS = (
    "job_type",
    "payload",
    "priority",
    "vesting_ms",
    "enqueued_ms",
    "error_count",
    "lease_id",
    "last_error",
    "content_type",
    "deadline_ms",
    "delivery",
    "attempts",
    "meta",
)


def table_cql(keyspace: str, table: str, gc_grace_seconds: int | None = None) -> str:
    options = " AND comment = 'quick queue zones: one partition per (app, tenant)'"
    if gc_grace_seconds is not None:
        options += f" AND gc_grace_seconds = {int(gc_grace_seconds)}"
    return f"""
CREATE TABLE IF NOT EXISTS {keyspace}.{table} (
    app text,
    tenant text,
    kind tinyint,
    o_priority int,
    o_vesting bigint,
    item_id text,
    job_type text,
    payload blob,
    priority int,
    vesting_ms bigint,
    enqueued_ms bigint,
    error_count int,
    lease_id text,
    last_error text,
    content_type text,
    deadline_ms bigint,
    delivery text,
    attempts int,
    meta blob,
    dead_reason text,
    dead_at_ms bigint,
    PRIMARY KEY ((app, tenant), kind, o_priority, o_vesting, item_id)
) WITH CLUSTERING ORDER BY (kind ASC, o_priority ASC, o_vesting ASC, item_id ASC)
{options}"""


def keyspace_cql(keyspace: str, replication: str) -> str:
    return f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}"


def parse_replication(spec: str) -> str:
    """``SimpleStrategy:3``, ``NetworkTopologyStrategy:dc1=3,dc2=3`` or a CQL map literal."""
    spec = spec.strip()
    if spec.startswith("{"):
        return spec
    strategy, _, rest = spec.partition(":")
    if strategy == "SimpleStrategy":
        if not rest.isdigit():
            raise ConfigurationError("SimpleStrategy needs a factor, e.g. SimpleStrategy:3")
        return f"{{'class': 'SimpleStrategy', 'replication_factor': {int(rest)}}}"
    if strategy == "NetworkTopologyStrategy":
        pairs = []
        for part in rest.split(","):
            dc, _, factor = part.partition("=")
            if not dc or not factor.isdigit():
                raise ConfigurationError(f"bad data center factor {part!r}, expected dc=3")
            pairs.append(f"'{dc.strip()}': {int(factor)}")
        return "{'class': 'NetworkTopologyStrategy', " + ", ".join(pairs) + "}"
    raise ConfigurationError(f"unknown replication {spec!r}")


def init_schema(
    session: Any,
    keyspace: str,
    *,
    replication: str | None = "SimpleStrategy:1",
    table: str = "zone_rows",
    gc_grace_seconds: int | None = None,
) -> None:
    """Create the keyspace (unless ``replication`` is None) and the zone table. Idempotent.

    Schema changes wait for schema agreement, so statements prepared right after see them.
    """
    if replication is not None:
        session.execute(keyspace_cql(keyspace, parse_replication(replication)))
    session.execute(table_cql(keyspace, table, gc_grace_seconds))
