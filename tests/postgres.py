"""The tests' PostgreSQL: one server for the session (a private cluster the suite starts,
``quickzones.testing.provision.postgres``), a fresh schema for every store URL, and every
schema dropped when the session ends (a server the environment names outlives it)."""

from __future__ import annotations

import atexit
import itertools
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from quickzones.testing.provision.postgres import shared_postgres_url

SESSION = f"qt{uuid.uuid4().hex[:8]}"
_schemas = itertools.count()
_used: list[str] = []


def postgres_store_url(schema: str | None = None) -> str:
    """A store URL on the session's server with a schema no other test uses."""
    server = shared_postgres_url()
    if schema is None:
        schema = f"{SESSION}_{next(_schemas)}"
    if not _used:
        atexit.register(_drop_schemas, server)
    _used.append(schema)
    sep = "&" if "?" in server else "?"
    return f"{server}{sep}schema={quote(schema)}"


def _drop_schemas(server: str) -> None:
    import contextlib

    import psycopg
    from psycopg import sql

    with contextlib.suppress(psycopg.Error), psycopg.connect(server, autocommit=True) as conn:
        for schema in _used:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def index_entries_read(conn: Any, index: str, sql: str, args: Mapping[str, Any]) -> int:
    """The entries of ``index`` (live or not) that ``sql`` reads with ``args`` on ``conn``
    (autocommit): the server's count, taken before and after in one transaction (the
    backend's counts are flushed, and start again, only between transactions). Heap
    pages, the buffers, are too few in a test's table to tell the dead versions a read
    walks."""
    count = "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)"
    with conn.transaction():
        (before,) = conn.execute(count, (index,)).fetchone()
        conn.execute(sql, args).fetchall()
        (after,) = conn.execute(count, (index,)).fetchone()
    return int(after) - int(before)


@contextmanager
def beside_a_report(url: str, schema: str) -> Iterator[Any]:
    """An autocommit connection to the store's server (to measure with), while a report
    holds a REPEATABLE READ snapshot (it has read ``schema``'s items table) until the
    block ends: what PostgreSQL keeps every row version for."""
    import psycopg

    server = url.split("?")[0]
    with psycopg.connect(server, autocommit=True) as conn, psycopg.connect(server) as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute(f'SELECT count(*) FROM "{schema}".quick_items')  # the snapshot
        yield conn
        report.execute("COMMIT")
