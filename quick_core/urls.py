"""Store and election URLs: one parser, and the scheme's factory from the registry.

The implementations register their schemes (:mod:`quickzones.schemes`: entry points, or
``register_store_scheme``); each is imported only when its scheme is opened, so
``quickzones`` needs no driver at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from quickzones import schemes
from quickzones.errors import InvalidStoreURL

if TYPE_CHECKING:
    from quickzones.clock import Clock
    from quickzones.consumer.election import Election
    from quickzones.store.kv import KVStore


# Options bounding quickzones.store.kv.run()'s retry loop, on every store URL that has them
# (fdb:// has its own of the same names, FDB's database options).
RETRY_OPTIONS = ("retry_limit", "timeout_ms")


def parse_retry_option(url: str, option: str, raw: str) -> int:
    """The value of a ``retry_limit``/``timeout_ms`` URL option: an integer >= 0."""
    try:
        value = int(raw)
    except ValueError as err:
        raise InvalidStoreURL(url, f"{option}={raw!r} is not an integer") from err
    if value < 0:
        raise InvalidStoreURL(url, f"{option} must be >= 0, got {value}")
    return value


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


def _load(group: str, url: str) -> Any:
    return schemes.factory(group, scheme_of(url), url)


def open_kv(url: str, *, clock: Clock | None = None, create: bool = True) -> KVStore:
    """Open the KV store a URL names (``memory://``, ``sqlite:///path``, ``fdb://``).

    ``create=False`` opens only an existing quick store and writes nothing while opening
    (commands that only read): a missing one raises ``StoreNotFound``, anything else
    ``NotAQuickStore``. A factory that takes no ``create`` keyword (stores without
    files, such as ``memory://`` or a cluster) just opens.
    """
    open_store = _load(schemes.STORES, url)
    store: KVStore
    if create or not schemes.accepts_create(open_store):
        store = open_store(url, clock=clock)
    else:
        store = open_store(url, clock=clock, create=False)
    return store


def open_election(url: str, *, clock: Clock | None = None) -> Election:
    """Open the election a URL names (``redis://``, ``rediss://``, ``memcached://``)."""
    open_one = _load(schemes.ELECTIONS, url)
    election: Election = open_one(url, clock=clock)
    return election
