"""Per-table storage and autovacuum settings for quick's churning PostgreSQL tables.

Every quick commit deletes or rewrites rows of ``kv``: a visit moves a pointer's vesting
entry (a delete and an insert) and rewrites its zone's pointer record and count, a
dequeue moves its items' order entries, a completion deletes them; and every commit that
writes inserts a row into ``quick_log`` that the prune deletes seconds later
(``quick_meta`` is written only when a store is created or migrated; the commit versions
come from a sequence, which leaves no dead rows). At any real rate that is far past
PostgreSQL's default vacuum thresholds, so autovacuum visits both tables at every
``autovacuum_naptime`` (a cluster setting, 1 min by default) whatever the per-table
settings say. What they can decide, measured with ``python -m bench.pg_long_txn
[--tuned]`` (docs/backends.md, "Beside long transactions"):

* ``kv``: ``fillfactor=80`` leaves a fifth of each page free, so a rewrite of the same
  key (a zone's pointer record and count, an item's lease) stays on its page as a HOT
  update: no new index entry, and the old version is pruned by the next reader of the
  page, without a vacuum, once no snapshot needs it. Measured: 90 % of kv's updates HOT
  instead of 78 % over a run, 79 % instead of 53 % beside a 120 s snapshot, at whose end
  a busy zone's pointer record and count cost 72 and 73 buffers to read instead of 151
  and 160 (as many items run meanwhile). ``autovacuum_vacuum_scale_factor=0.02``
  with a threshold of 1,000: a ``kv`` grown large (a backlog of a million items) is
  vacuumed after 2 % of it is dead, not 20 %, so the dead entries the scanner and the
  zone peeks walk stay bounded; under quick's churn a small ``kv`` is vacuumed at every
  naptime anyway.
* ``quick_log``: PostgreSQL's thresholds (50 dead rows plus 20 %) are crossed within a
  second; its vacuums run unthrottled (``autovacuum_vacuum_cost_delay=0``: a few pages,
  so they end at once, even bloated).

None of this helps much *while* a transaction holds an old snapshot of the same database
(a report's REPEATABLE READ transaction, a session idle in transaction, a replication slot
or a standby with ``hot_standby_feedback``): no row version newer than its snapshot can be
removed, by vacuum or by pruning; see docs/backends.md for what does.

:func:`autovacuum_statements` returns the ``ALTER TABLE`` statements for the two tables'
names (psycopg identifiers, schema-qualified); each is idempotent, so a store's creation
and its migration can both run them (``fillfactor`` applies to pages written from then on).
"""

from __future__ import annotations

from collections.abc import Mapping

from psycopg import sql as pgsql

# Settings per table (PostgreSQL storage parameters); numbers as PostgreSQL reads them.
KV_SETTINGS: Mapping[str, str] = {
    "fillfactor": "80",
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "1000",
}
LOG_SETTINGS: Mapping[str, str] = {"autovacuum_vacuum_cost_delay": "0"}


def _alter(table: pgsql.Composable, settings: Mapping[str, str]) -> str:
    # Names and values are this module's constants; the table is a composed identifier.
    options = pgsql.SQL(", ").join(
        pgsql.SQL("{} = {}").format(pgsql.SQL(name), pgsql.SQL(value))
        for name, value in settings.items()
    )
    return pgsql.SQL("ALTER TABLE {} SET ({})").format(table, options).as_string()


def autovacuum_statements(kv: pgsql.Composable, log: pgsql.Composable) -> tuple[str, ...]:
    """``ALTER TABLE ... SET (...)`` for ``kv`` and ``quick_log`` (identifiers such as
    ``psycopg.sql.Identifier(schema, "kv")``), rendered as text."""
    return (_alter(kv, KV_SETTINGS), _alter(log, LOG_SETTINGS))


def schema_statements(schema: str) -> tuple[str, ...]:
    """:func:`autovacuum_statements` for the tables of ``schema``."""
    return autovacuum_statements(
        pgsql.Identifier(schema, "kv"), pgsql.Identifier(schema, "quick_log")
    )


__all__ = [
    "KV_SETTINGS",
    "LOG_SETTINGS",
    "autovacuum_statements",
    "schema_statements",
]
