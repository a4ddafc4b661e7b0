"""memcached adapter: the sequential scanner's election as a lease item in memcached.

Import :class:`MemcachedElection`; the ``pymemcache`` driver is imported only when an
election is built, so this package imports fine without it.
"""

from __future__ import annotations

from quickzones.adapters.memcached.election import (
    DEFAULT_KEY_PREFIX,
    MemcachedElection,
    server_expiry,
)

__all__ = ["DEFAULT_KEY_PREFIX", "MemcachedElection", "server_expiry"]
