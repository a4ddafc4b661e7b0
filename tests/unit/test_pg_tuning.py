"""The per-table autovacuum settings of ``backends/postgres/tuning.py``: applied to a
store's churning tables, kv and quick_log (whatever its schema is called), PostgreSQL
holds them, and applying them again changes nothing."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql as pgsql

from quickzones.backends.postgres.tuning import (
    KV_SETTINGS,
    LOG_SETTINGS,
    autovacuum_statements,
    schema_statements,
)
from quickzones.client import Quick
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)

RELOPTIONS = """SELECT c.relname, c.reloptions FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'"""


def test_the_settings_land_on_the_tables_of_an_oddly_named_schema() -> None:
    schema = 'we"ird $$ Schema'
    url = postgres_store_url(schema)
    Quick.open(url).close()
    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        for _ in range(2):  # idempotent: a creation and a later migration may both run them
            for statement in schema_statements(schema):
                conn.execute(statement)
        options = {
            name: dict(option.split("=", 1) for option in (opts or []))
            for name, opts in conn.execute(RELOPTIONS, (schema,))
        }

    assert options == {"kv": dict(KV_SETTINGS), "quick_meta": {}, "quick_log": dict(LOG_SETTINGS)}


def test_the_statements_name_the_tables_they_are_given() -> None:
    statements = autovacuum_statements(
        pgsql.Identifier("s", "kv"), pgsql.Identifier("s", "quick_log")
    )

    assert [s.split(" SET ")[0] for s in statements] == [
        'ALTER TABLE "s"."kv"',
        'ALTER TABLE "s"."quick_log"',
    ]
