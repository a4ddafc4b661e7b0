"""Which of Django's databases is quick's store: the one whose transactions an enqueue
joins (the item commits with the application's rows) or, when none is, none.

Derived, not configured: the store URL names a database and ``settings.DATABASES`` names
Django's; the alias whose ``NAME``, ``HOST`` and ``PORT`` are the store's (for SQLite, the
same file) is the one. A mismatch found only at the enqueue (another server behind the
same name) still falls back to enqueueing after the commit (``OtherDatabase``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from django.db import connections

# The Django database vendor whose connection a store's scheme can join.
VENDOR = {"postgresql": "postgresql", "postgres": "postgresql", "sqlite": "sqlite"}
_PG_PORT = 5432


def store_alias(store: str) -> str | None:
    """The alias of the Django database that is the store ``store``, or None."""
    scheme = store.partition(":")[0].lower()
    vendor = VENDOR.get(scheme)
    if vendor is None:
        return None
    for alias in connections:
        conn = connections[alias]
        if conn.vendor == vendor and _same(vendor, store, conn.settings_dict):
            return str(alias)
    return None


def _same(vendor: str, store: str, db: dict[str, Any]) -> bool:
    url = urlsplit(store)
    if vendor == "sqlite":
        name = str(db.get("NAME") or "")
        # sqlite:///relative.db and sqlite:////absolute.db: the path after the third
        # slash, read as the SQLite backend reads it.
        path = unquote(url.path)[1:]
        if not name or name == ":memory:" or not path:
            return False
        return Path(name).resolve() == Path(path).resolve()
    return (
        unquote(url.path.lstrip("/")) == str(db.get("NAME") or "")
        and (url.hostname or "localhost") == (str(db.get("HOST") or "") or "localhost")
        and (url.port or _PG_PORT) == int(db.get("PORT") or _PG_PORT)
    )
