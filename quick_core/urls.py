"""Store and election URLs: one factory from a URL scheme to an implementation.

Drivers are imported lazily so ``quick_core`` never needs one at import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from quick_core.errors import InvalidStoreURL

if TYPE_CHECKING:
    from quick_core.clock import Clock
    from quick_core.election import Election
    from quick_core.kv import KVStore

# scheme -> (module, class); each class has ``from_url(url, clock=...)``.
KV_SCHEMES: dict[str, tuple[str, str]] = {
    "memory": ("backends.memory", "MemoryStore"),
    "sqlite": ("backends.sqlite", "SQLiteStore"),
    "fdb": ("backends.fdb", "FDBStore"),
    # The FDB backend's own code over the simulator standing in for libfdb_c (tests).
    "fdbsim": ("backends.fdb", "FDBStore"),
}

ELECTION_SCHEMES: dict[str, tuple[str, str]] = {
    "redis": ("adapters.redis", "RedisElection"),
    "rediss": ("adapters.redis", "RedisElection"),
    "memcached": ("adapters.memcached", "MemcachedElection"),
}


def scheme_of(url: str) -> str:
    if not isinstance(url, str) or not url:
        raise InvalidStoreURL(str(url), "expected a non-empty string such as sqlite:///quick.db")
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise InvalidStoreURL(url, str(err)) from err
    if not parts.scheme:
        raise InvalidStoreURL(url, "missing scheme (memory://, sqlite:///path, fdb://)")
    return parts.scheme.lower()


def _load(table: dict[str, tuple[str, str]], url: str) -> Any:
    scheme = scheme_of(url)
    if scheme not in table:
        known = ", ".join(f"{s}://" for s in sorted(table))
        raise InvalidStoreURL(url, f"unknown scheme {scheme!r}; expected one of {known}")
    module_name, class_name = table[scheme]
    module = importlib.import_module(module_name)
    return getattr(module, class_name)


def open_kv(url: str, *, clock: Clock | None = None) -> KVStore:
    """Open the KV store a URL names (``memory://``, ``sqlite:///path``, ``fdb://``)."""
    cls = _load(KV_SCHEMES, url)
    store: KVStore = cls.from_url(url, clock=clock)
    return store


def open_election(url: str, *, clock: Clock | None = None) -> Election:
    """Open the election a URL names (``redis://``, ``rediss://``, ``memcached://``)."""
    cls = _load(ELECTION_SCHEMES, url)
    election: Election = cls.from_url(url, clock=clock)
    return election
