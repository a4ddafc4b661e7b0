"""Redis adapter: the sequential scanner's election as a lease in Redis.

Import :class:`RedisElection`; the ``redis`` driver is imported only when an election is
built, so this package imports fine without it.
"""

from __future__ import annotations

from quickzones.adapters.redis.election import DEFAULT_KEY_PREFIX, RedisElection

__all__ = ["DEFAULT_KEY_PREFIX", "RedisElection"]
