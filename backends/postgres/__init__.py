"""The PostgreSQL backend: ``PostgresStore`` over psycopg 3, with FoundationDB's meaning
(``docs/fdb-semantics.md``) kept by the same client half as SQLite's (``txnbuffer``).

URL: ``postgresql://user:password@host:port/database?schema=quick`` (``postgres://`` too);
options ``schema`` (default ``quick``), ``lock_timeout_ms``, ``retry_limit``, ``timeout_ms``;
any other option is handed to libpq (``sslmode=...``, ``application_name=...``).
"""

from quickzones.errors import MissingDependency

try:
    from quickzones.backends.postgres.store import PostgresStore, PostgresTransaction
except ImportError as err:  # psycopg absent, or present without a libpq it can load
    if err.name is not None and not err.name.startswith("psycopg"):
        raise
    raise MissingDependency(
        "psycopg", "postgres", f"postgresql:// store URLs need it: {err}"
    ) from err

__all__ = ["PostgresStore", "PostgresTransaction"]
