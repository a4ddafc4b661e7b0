"""``RedisElection``: the scanner election as a lease key in Redis (needs Redis >= 5).

Storage, per election name (the ``{name}`` hash tag keeps both keys in one cluster slot so
the scripts may touch both)::

    <prefix>{<name>}        -> b"<term>:<holder>"   PX ttl   (the lease)
    <prefix>{<name>}:term   -> decimal counter              (fencing terms, no TTL)

Every operation is one Lua script, so each is atomic on the server:

- acquire: if the lease key is absent, bump the term counter and ``SET NX PX`` the lease; if
  the caller already holds it, extend it and keep the term (so a retry after a lost reply
  gets the lease instead of locking its own holder out for a whole TTL); else refuse.
- renew / release: compare the stored ``term:holder`` with the caller's, then ``PEXPIRE`` /
  ``DEL``. A deposed holder (different term) or a stranger changes nothing.

Terms never repeat, even when Redis loses the counter (restart without persistence,
eviction, failover to a replica that missed the last INCR, restore of an older RDB): before
the INCR the script raises the counter to at least the server's clock in microseconds
(``TIME``). Terms therefore grow by one per holder while the counter survives and jump to
"now in µs" when it does not. The assumption is that the Redis server's wall clock does not
step back across a restart by more than the restart took, and that there are fewer than a
million new holders per second (each new holder needs a lease to expire or be released).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from quickzones.clock import Clock, SystemClock
from quickzones.consumer.election import Leadership
from quickzones.consumer.election import check_ids as _check_ids
from quickzones.consumer.election import ttl_ms as _ttl_ms
from quickzones.errors import (
    InvalidStoreURL,
    MissingDependency,
    StorageError,
)

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script

DEFAULT_KEY_PREFIX = "quick:election:"

# Short by default: an election call is one tiny script, and a scanner that cannot reach its
# lease store must learn so well inside its TTL (seconds) to stop scanning in time.
DEFAULT_SOCKET_TIMEOUT = 0.5
DEFAULT_CONNECT_TIMEOUT = 0.5

# Query parameters passed through to redis-py; anything else is a typo we refuse early
# rather than a TypeError at the first command.
_PASSTHROUGH = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "health_check_interval",
        "client_name",
        "max_connections",
    }
)
_TLS_PASSTHROUGH = frozenset(
    {
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_ciphers",
        "ssl_min_version",
    }
)
_OWN = frozenset({"key_prefix"})

# KEYS[1] lease, KEYS[2] term counter; ARGV[1] holder, ARGV[2] ttl in ms.
# Returns the term as a string (an integer past 2^31 is safest kept out of Lua's number
# formatting), or nil when someone else holds the lease.
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, ':', 1, true)
  if sep and string.sub(cur, sep + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return string.sub(cur, 1, sep - 1)
  end
  return false
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last < now_us then
  redis.call('SET', KEYS[2], string.format('%d', now_us))
end
local term = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], term .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2])
return term
"""

# KEYS[1] lease; ARGV[1] expected "term:holder", ARGV[2] ttl in ms. 1 if extended.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lease; ARGV[1] expected "term:holder". 1 if deleted.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _import_redis() -> Any:
    try:
        import redis
    except ImportError as err:
        raise MissingDependency("redis", "redis", str(err)) from err
    return redis


class RedisElection:
    """An :class:`~quickzones.consumer.election.Election` backed by one Redis server.

    Thread-safe (redis-py's connection pool); each call is one atomic script. The returned
    ``expires_at`` is the injected clock's time *before* the request was sent plus ``ttl``,
    so it never lies later than the server's own expiry; the holder must stop leading by
    then unless a renew has succeeded.
    """

    def __init__(
        self,
        client: Redis,
        *,
        clock: Clock | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        owns_client: bool = False,
    ) -> None:
        """Wrap a ``redis.Redis`` client (bytes responses); ``close`` closes it if owned."""
        redis = _import_redis()
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self._prefix = key_prefix
        self._owns_client = owns_client
        exc = redis.exceptions
        # AuthenticationError subclasses ConnectionError but no retry will fix a password.
        self._fatal: tuple[type[BaseException], ...] = (exc.AuthenticationError,)
        # ReadOnlyError: we wrote to a replica mid-failover; the next try finds the primary.
        self._transient: tuple[type[BaseException], ...] = (
            exc.ConnectionError,
            exc.TimeoutError,
            exc.ReadOnlyError,
            OSError,
        )
        self._any: tuple[type[BaseException], ...] = (exc.RedisError,)
        self._acquire: Script = client.register_script(_ACQUIRE)
        self._renew: Script = client.register_script(_RENEW)
        self._release: Script = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RedisElection:
        """Open ``redis://[[user]:password@]host[:port][/db][?options]`` (or ``rediss://``).

        Options: ``socket_timeout`` and ``socket_connect_timeout`` (seconds, default 0.5),
        ``socket_keepalive``, ``health_check_interval``, ``client_name``,
        ``max_connections``, ``key_prefix`` (default ``quick:election:``); with
        ``rediss://`` also ``ssl_cert_reqs`` (none|optional|required), ``ssl_ca_certs``,
        ``ssl_ca_path``, ``ssl_ca_data``, ``ssl_certfile``, ``ssl_keyfile``,
        ``ssl_password``, ``ssl_check_hostname``, ``ssl_ciphers``, ``ssl_min_version``.
        """
        redis = _import_redis()
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as err:
            raise InvalidStoreURL(url, str(err)) from err
        scheme = parts.scheme.lower()
        if scheme not in ("redis", "rediss"):
            raise InvalidStoreURL(url, "expected redis:// or rediss://")
        if not parts.hostname:
            raise InvalidStoreURL(url, "missing host, e.g. redis://127.0.0.1:6379/0")
        if port is not None and not 0 < port < 65536:
            raise InvalidStoreURL(url, f"port {port} out of range")
        allowed = _PASSTHROUGH | _OWN | (_TLS_PASSTHROUGH if scheme == "rediss" else set())
        query = parse_qsl(parts.query, keep_blank_values=True)
        unknown = sorted({k for k, _ in query} - allowed)
        if unknown:
            hint = " (TLS options need rediss://)" if set(unknown) & _TLS_PASSTHROUGH else ""
            raise InvalidStoreURL(url, f"unknown option(s) {', '.join(unknown)}{hint}")
        options = dict(query)
        key_prefix = options.pop("key_prefix", DEFAULT_KEY_PREFIX)
        if options.get("ssl_cert_reqs", "").lower() == "none":
            # Without verification there is no certificate to match a hostname against;
            # Python's ssl refuses CERT_NONE with check_hostname on, so default it off.
            options.setdefault("ssl_check_hostname", "false")
        driver_url = urlunsplit(parts._replace(query=urlencode(options)))
        # Retry once, at once, only on ConnectionError: that is a pooled socket the server
        # closed (it restarted) or a refused connect, both cheap to try again. Timeouts are
        # not retried so an unreachable server is reported within one timeout.
        retry = redis.retry.Retry(
            redis.backoff.NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)
        )
        try:
            client = redis.Redis.from_url(
                driver_url,
                socket_timeout=DEFAULT_SOCKET_TIMEOUT,
                socket_connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                retry=retry,
            )
        except (ValueError, TypeError) as err:
            raise InvalidStoreURL(url, str(err)) from err
        return cls(client, clock=clock, key_prefix=key_prefix, owns_client=True)

    # --- Election -------------------------------------------------------------------

    def try_acquire(self, name: str, holder: str, ttl: float) -> Leadership | None:
        """Take the lease if free (new, larger term) or extend it if ``holder`` has it."""
        _check_ids(name, holder)
        ttl_ms = _ttl_ms(ttl)
        start = self._clock.now()
        with self._storage_errors("acquire", name):
            raw = self._acquire(keys=[self._key(name), self._term_key(name)], args=[holder, ttl_ms])
        if raw is None:
            return None
        return Leadership(name, holder, int(raw), start + ttl)

    def renew(self, lease: Leadership, ttl: float) -> Leadership | None:
        """Extend the lease to ``ttl`` from now; None if ``lease`` is no longer current."""
        ttl_ms = _ttl_ms(ttl)
        start = self._clock.now()
        with self._storage_errors("renew", lease.name):
            ok = self._renew(keys=[self._key(lease.name)], args=[_value(lease), ttl_ms])
        if not ok:
            return None
        return Leadership(lease.name, lease.holder, lease.term, start + ttl)

    def release(self, lease: Leadership) -> bool:
        """Give the lease up at once; False if ``lease`` was no longer current."""
        with self._storage_errors("release", lease.name):
            ok = self._release(keys=[self._key(lease.name)], args=[_value(lease)])
        return bool(ok)

    def close(self) -> None:
        """Close the client's connections if this election opened it."""
        if self._owns_client:
            self._client.close()

    # --- internals ------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self._prefix}{{{name}}}"

    def _term_key(self, name: str) -> str:
        return f"{self._prefix}{{{name}}}:term"

    @contextmanager
    def _storage_errors(self, op: str, name: str) -> Iterator[None]:
        """Translate driver errors into ``StorageError``, keeping the cause."""
        try:
            yield
        except self._fatal as err:
            raise StorageError(f"redis election {op} {name!r}: {err}", retryable=False) from err
        except self._transient as err:
            raise StorageError(f"redis election {op} {name!r}: {err}", retryable=True) from err
        except self._any as err:
            raise StorageError(f"redis election {op} {name!r}: {err}", retryable=False) from err


def _value(lease: Leadership) -> str:
    return f"{lease.term}:{lease.holder}"
