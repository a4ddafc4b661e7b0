"""The SQLite backend: ``SQLiteStore`` over stdlib sqlite3 (WAL, memcmp-ordered BLOB keys).

URLs: ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``; options
``busy_timeout_ms`` and ``synchronous``.
"""

from quickzones.backends.sqlite.store import SQLiteStore, SQLiteTransaction

__all__ = ["SQLiteStore", "SQLiteTransaction"]
