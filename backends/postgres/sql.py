"""The PostgreSQL backend's schema and statements, each for one named schema.

``kv.key`` is ``bytea``: PostgreSQL compares bytea with memcmp (then length), so keys sort
exactly as in FoundationDB. ``quick_meta`` holds the last commit version (its row lock
serialises commits: the resolver) and the layout's name and version (what makes a schema
quick's); ``quick_conflicts`` holds each recent commit's write conflict ranges.
"""

from __future__ import annotations

import functools

from quickzones.backends._ranges import encode_ranges

# What quick_meta.format holds in a schema quick made; FORMAT_VERSION is this code's
# layout (a newer one is refused, an older one migrated by _MIGRATIONS).
FORMAT = "quickzones-kv"
FORMAT_VERSION = 1
QUICK_TABLES = frozenset({"kv", "quick_meta", "quick_conflicts"})
# Conflict ranges covering every key a transaction can read (system keys are refused).
EVERY_KEY = encode_ranges([(b"", b"\xff")])
KEYS_PER_SELECT = 1000


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


class Statements:
    """Every statement the backend runs, qualified by its schema (each text built once,
    on first use: they are on every transaction's path)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    def _t(self, table: str) -> str:
        return f"{quote_ident(self.schema)}.{table}"

    @functools.cached_property
    def create(self) -> tuple[str, ...]:
        s = quote_ident(self.schema)
        return (
            f"CREATE SCHEMA IF NOT EXISTS {s}",
            f"CREATE TABLE {s}.kv (key bytea PRIMARY KEY, value bytea NOT NULL)",
            f"CREATE TABLE {s}.quick_meta (id int PRIMARY KEY CHECK (id = 0),"
            " version bigint NOT NULL, format text NOT NULL, format_version int NOT NULL)",
            f"INSERT INTO {s}.quick_meta VALUES (0, 0, '{FORMAT}', {FORMAT_VERSION})",
            f"CREATE TABLE {s}.quick_conflicts (version bigint PRIMARY KEY, ranges bytea NOT NULL)",
        )

    @functools.cached_property
    def version(self) -> str:
        return f"SELECT version FROM {self._t('quick_meta')} WHERE id = 0"

    @functools.cached_property
    def lock_version(self) -> str:
        # The resolver's lock: one commit at a time holds this row until it ends.
        return f"SELECT version FROM {self._t('quick_meta')} WHERE id = 0 FOR UPDATE"

    @functools.cached_property
    def meta(self) -> str:
        return f"SELECT format, format_version FROM {self._t('quick_meta')} WHERE id = 0"

    @functools.cached_property
    def get(self) -> str:
        return f"SELECT value FROM {self._t('kv')} WHERE key = %s"

    @functools.cached_property
    def get_many(self) -> str:
        return f"SELECT key, value FROM {self._t('kv')} WHERE key = ANY(%s)"

    @functools.cached_property
    def range(self) -> str:
        return f"SELECT key, value FROM {self._t('kv')} WHERE key >= %s AND key < %s ORDER BY key"

    @functools.cached_property
    def range_reverse(self) -> str:
        return (
            f"SELECT key, value FROM {self._t('kv')} WHERE key >= %s AND key < %s"
            " ORDER BY key DESC"
        )

    @functools.cached_property
    def upsert(self) -> str:
        return (
            f"INSERT INTO {self._t('kv')} (key, value) VALUES (%s, %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )

    @functools.cached_property
    def delete(self) -> str:
        return f"DELETE FROM {self._t('kv')} WHERE key = %s"

    @functools.cached_property
    def delete_range(self) -> str:
        return f"DELETE FROM {self._t('kv')} WHERE key >= %s AND key < %s"

    @functools.cached_property
    def newer_conflicts(self) -> str:
        return f"SELECT ranges FROM {self._t('quick_conflicts')} WHERE version > %s"

    @functools.cached_property
    def record_conflicts(self) -> str:
        return f"INSERT INTO {self._t('quick_conflicts')} (version, ranges) VALUES (%s, %s)"

    @functools.cached_property
    def bump_version(self) -> str:
        return f"UPDATE {self._t('quick_meta')} SET version = %s WHERE id = 0"

    @functools.cached_property
    def prune_conflicts(self) -> str:
        return f"DELETE FROM {self._t('quick_conflicts')} WHERE version < %s"

    @functools.cached_property
    def newest_before(self) -> str:
        return f"SELECT max(version) FROM {self._t('quick_conflicts')} WHERE version < %s"

    @functools.cached_property
    def everything(self) -> str:
        return f"SELECT key, value FROM {self._t('kv')} ORDER BY key"


TABLES_IN_SCHEMA = (
    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
)
SCHEMA_EXISTS = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
