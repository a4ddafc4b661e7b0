"""The SQLite backend's schema and the SQL statements it runs."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from quickzones.backends._atomics import AtomicOp, apply_atomic
from quickzones.backends._ranges import encode_ranges

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS quick_meta"
    " (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO quick_meta (id, version) VALUES (0, 0)",
    "CREATE TABLE IF NOT EXISTS quick_conflicts"
    " (version INTEGER PRIMARY KEY, ranges BLOB NOT NULL)",
)
_VERSION = "SELECT version FROM quick_meta WHERE id = 0"
# The commits after a version (the commit counter: whose they were).
_VERSIONS_AFTER = "SELECT version FROM quick_conflicts WHERE version > ?"
_GET = "SELECT value FROM kv WHERE key = ?"
# A batch of point reads in one statement (read_many); {} holds the placeholders.
_GET_MANY = "SELECT key, value FROM kv WHERE key IN ({})"
_KEYS_PER_SELECT = 500  # well under SQLite's limit on host parameters (999 before 3.32)
# The statement for each number of keys, made once. A few keys (an enqueue reads 2 or 3 a
# statement) as point lookups joined by UNION ALL: a third cheaper than IN, which builds
# and sorts an ephemeral table of the keys first.
_POINTS_UP_TO = 8
_GET_MANY_OF = [
    " UNION ALL ".join(["SELECT key, value FROM kv WHERE key = ?"] * n)
    if n <= _POINTS_UP_TO
    else _GET_MANY.format(", ".join("?" * n))
    for n in range(_KEYS_PER_SELECT + 1)
]
# A snapshot's version and its first few keys in one statement (the first read of a
# transaction): the version's row has no key (kv's keys are never NULL).
_VERSION_AND_GET_OF = {
    n: "SELECT NULL, version FROM quick_meta WHERE id = 0 UNION ALL " + _GET_MANY_OF[n]
    for n in range(1, _POINTS_UP_TO + 1)
}
_RANGE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"
_RANGE_REVERSE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT ?"
_UPSERT = (
    "INSERT INTO kv (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
# FoundationDB's atomic add applied by SQLite itself (quick_add, registered on each of the
# store's connections by add_function): no read of the operand into Python first.
_ADD = (
    "INSERT INTO kv (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = quick_add(value, excluded.value)"
)
_DELETE = "DELETE FROM kv WHERE key = ?"
_DELETE_RANGE = "DELETE FROM kv WHERE key >= ? AND key < ?"
_NEWER_CONFLICTS = "SELECT ranges FROM quick_conflicts WHERE version > ?"
_RECORD_CONFLICTS = "INSERT INTO quick_conflicts (version, ranges) VALUES (?, ?)"
_BUMP_VERSION = "UPDATE quick_meta SET version = ? WHERE id = 0"
_PRUNE_CONFLICTS = "DELETE FROM quick_conflicts WHERE version < ?"
_NEWEST_BEFORE = "SELECT max(version) FROM quick_conflicts WHERE version < ?"
# Conflict ranges covering every key a transaction can read (system keys are refused).
_EVERY_KEY = encode_ranges([(b"", b"\xff")])
# The tables that make a file a quick store (checked before anything is written).
_QUICK_TABLES = frozenset({"kv", "quick_meta", "quick_conflicts"})


# Every key, value and range list is bound as a bytearray (blob(...)): the sqlite3 module
# binds a bytearray, as it binds int, float and str, at once, but offers any other type,
# bytes included, to its adapters first, which on CPython 3.11 raises and clears an
# AttributeError for each parameter (a few microseconds an enqueue). SQLite stores the same
# BLOB either way, and reads it back as bytes.
blob = bytearray


def _add(stored: bytes | None, param: bytes) -> bytes | None:
    """quick_add(stored, param): FoundationDB's add, the one the buffer applies."""
    return apply_atomic(AtomicOp.ADD, stored, param)


def add_function(conn: sqlite3.Connection) -> None:
    """Register quick_add (:data:`_ADD`) on one of the store's own connections."""
    conn.create_function("quick_add", 2, _add, deterministic=True)


def read_many(conn: sqlite3.Connection, keys: Sequence[bytes]) -> dict[bytes, bytes]:
    """The stored values of ``keys`` that exist, in as few statements as the host
    parameter limit allows (BLOB columns come back as ``bytes``)."""
    found: dict[bytes, bytes] = {}
    for at in range(0, len(keys), _KEYS_PER_SELECT):
        chunk = keys[at : at + _KEYS_PER_SELECT]
        found.update(conn.execute(_GET_MANY_OF[len(chunk)], [blob(key) for key in chunk]))
    return found
