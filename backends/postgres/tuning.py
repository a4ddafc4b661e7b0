"""Per-table storage and autovacuum settings for quick's three PostgreSQL tables.

Every quick commit deletes or rewrites rows: a visit moves a pointer's vesting entry
(a delete and an insert in ``kv``), a dequeue rewrites its items' records and order
entries, a completion deletes them, every commit bumps the one row of ``quick_meta`` and
inserts a row into ``quick_conflicts`` that the resolver's prune deletes seconds later.
At a few hundred items a second that is thousands of dead row versions a second, far
past PostgreSQL's default thresholds, so autovacuum visits each table at every
``autovacuum_naptime`` whatever these say; what the per-table settings decide is how
fast those vacuums finish and how much of the churn never needs one:

* ``kv``: ``fillfactor=80`` leaves a fifth of each page free, so a rewrite of the same
  key (a pointer's record, an item's lease, a count) can stay on its page as a HOT update:
  no new index entry, and the old version is pruned by the next reader of the page, with
  no vacuum, as soon as no snapshot needs it. A vacuum of ``kv`` runs unthrottled
  (``autovacuum_vacuum_cost_delay=0``: the default 2 ms naps make a vacuum of a table
  bloated by a long transaction take minutes, while quick's reads walk its dead index
  entries), and starts after 1,000 dead rows plus 2 % of the table instead of 20 %.
* ``quick_meta``: one row, rewritten by every commit: vacuumed after 1,000 dead
  versions, unthrottled (it is a few pages, except after a long transaction).
* ``quick_conflicts``: rows live 5 s: vacuumed after 5,000 dead rows, unthrottled.

None of this helps *while* a transaction holds an old snapshot (a report's REPEATABLE
READ transaction, a session idle in transaction, a replication slot or a standby with
``hot_standby_feedback``): no dead version newer than its snapshot can be removed, by
vacuum or by pruning. See docs/backends.md, "Beside long transactions", for what does.

:func:`autovacuum_statements` returns the ``ALTER TABLE`` statements for the three
tables' names (psycopg identifiers, schema-qualified); each is idempotent, so a store's
creation and its migration can both run them.
"""

from __future__ import annotations

from collections.abc import Mapping

from psycopg import sql as pgsql

# Settings per table (PostgreSQL storage parameters); numbers as PostgreSQL reads them.
KV_SETTINGS: Mapping[str, str] = {
    "fillfactor": "80",
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
    "autovacuum_analyze_scale_factor": "0.05",
}
META_SETTINGS: Mapping[str, str] = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
}
CONFLICTS_SETTINGS: Mapping[str, str] = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_cost_delay": "0",
}


def _alter(table: pgsql.Composable, settings: Mapping[str, str]) -> str:
    # Names and values are this module's constants; the table is a composed identifier.
    options = pgsql.SQL(", ").join(
        pgsql.SQL("{} = {}").format(pgsql.SQL(name), pgsql.SQL(value))
        for name, value in settings.items()
    )
    return pgsql.SQL("ALTER TABLE {} SET ({})").format(table, options).as_string()


def autovacuum_statements(
    kv: pgsql.Composable, meta: pgsql.Composable, conflicts: pgsql.Composable
) -> tuple[str, ...]:
    """``ALTER TABLE ... SET (...)`` for ``kv``, ``quick_meta`` and ``quick_conflicts``
    (identifiers such as ``psycopg.sql.Identifier(schema, "kv")``), rendered as text."""
    return (
        _alter(kv, KV_SETTINGS),
        _alter(meta, META_SETTINGS),
        _alter(conflicts, CONFLICTS_SETTINGS),
    )


def schema_statements(schema: str) -> tuple[str, ...]:
    """:func:`autovacuum_statements` for the tables of ``schema``."""
    return autovacuum_statements(
        pgsql.Identifier(schema, "kv"),
        pgsql.Identifier(schema, "quick_meta"),
        pgsql.Identifier(schema, "quick_conflicts"),
    )


__all__ = [
    "CONFLICTS_SETTINGS",
    "KV_SETTINGS",
    "META_SETTINGS",
    "autovacuum_statements",
    "schema_statements",
]
