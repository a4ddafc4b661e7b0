"""``MemcachedElection``: the scanner election as a lease item in one memcached server.

Storage, per election name::

    <prefix><name>        -> b"<term>:<holder>"   exptime ceil(ttl) + 1 s  (the lease)
    <prefix><name>:term   -> decimal counter      no exptime               (fencing terms)

A name that is not a valid memcached key (spaces, control bytes, too long) is replaced by
``sha256:<hex>`` of it.

memcached has no scripts, so each step is one compare-and-set:

- acquire: ``add`` a placeholder ``0:<holder>`` (only succeeds if no live item), then ``incr``
  the term counter, then ``gets``/``cas`` the placeholder into ``<term>:<holder>``. Taking
  the term *after* winning the ``add`` is what keeps terms increasing from one holder to the
  next: holder k's term was drawn while its item existed, and holder k+1 can only ``add``
  once that item is gone. A candidate that finds its own live lease extends it and keeps
  the term; one that finds its own placeholder (an earlier attempt died half-way, or a reply
  was lost) finishes it.
- renew: ``gets``, compare ``term:holder``, ``cas`` the same value with a fresh exptime.
- release: ``gets``, compare, ``cas`` with a negative exptime, which memcached treats as
  already expired; a plain ``delete`` has no compare in the text protocol.

TTLs are whole seconds in memcached, and its clock ticks once a second, so an item stored
with exptime N vanishes after anywhere between N-1 and N seconds. We therefore store
``ceil(ttl) + 1`` (see :func:`server_expiry`): the lease lives on the server for at least
``ttl`` (the holder's local ``expires_at`` stays safe) and at most ``ceil(ttl) + 1``
seconds, which bounds how long a dead holder blocks the others.

Terms never repeat across a restart (memcached keeps nothing) or an eviction of the
counter: a missing counter is re-created with ``add`` seeded from the wall clock in
microseconds (the larger of this host's and the server's ``stats time``), so the new
counter starts above every term the old one handed out. That assumes the clocks do not step
back by more than the outage lasted and that fewer than a million terms are drawn per second.
"""

from __future__ import annotations

import hashlib
import math
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from quickzones.clock import Clock, SystemClock
from quickzones.consumer.election import Leadership
from quickzones.consumer.election import check_ids as _check_ids
from quickzones.errors import (
    InvalidArgument,
    InvalidStoreURL,
    MissingDependency,
    StorageError,
)

T = TypeVar("T")

DEFAULT_KEY_PREFIX = "quick:election:"
DEFAULT_PORT = 11211
# Short by default: a scanner that cannot reach its lease store must learn so well inside
# its TTL (seconds) to stop scanning in time.
DEFAULT_TIMEOUT = 0.5
DEFAULT_CONNECT_TIMEOUT = 0.5

# memcached reads an exptime above 30 days as an absolute Unix time.
_MAX_RELATIVE_EXPTIME = 60 * 60 * 24 * 30
_MAX_KEY_BYTES = 250
_TERM_SUFFIX = ":term"
_PLACEHOLDER_TERM = 0
# How often one call retries on a pooled socket the server had closed (it restarted); each
# such failure drops that socket, so the retry dials afresh.
_STALE_RETRIES = 2

_OPTIONS = frozenset(
    {
        "timeout",
        "connect_timeout",
        "max_pool_size",
        "key_prefix",
        "tls",
        "tls_ca_certs",
        "tls_certfile",
        "tls_keyfile",
        "tls_cert_reqs",
        "tls_check_hostname",
    }
)


def server_expiry(ttl: float) -> int:
    """The whole-second exptime stored for ``ttl``: ``ceil(ttl) + 1`` (see module doc)."""
    if not (isinstance(ttl, int | float) and math.isfinite(ttl) and ttl > 0):
        raise InvalidArgument("ttl", ttl, "must be a finite number of seconds > 0")
    seconds = math.ceil(ttl) + 1
    if seconds > _MAX_RELATIVE_EXPTIME:
        raise InvalidArgument("ttl", ttl, "must be under 30 days for memcached")
    return seconds


def _import_pymemcache() -> Any:
    try:
        import pymemcache.client.base
        import pymemcache.exceptions
    except ImportError as err:
        raise MissingDependency("pymemcache", "memcached", str(err)) from err
    return pymemcache


def _parse(value: bytes | None) -> tuple[int, str] | None:
    """(term, holder) from a stored lease value; None if absent or not ours to read."""
    if value is None:
        return None
    term, sep, holder = value.partition(b":")
    if not sep or not term.isdigit():
        return None
    return int(term), holder.decode("utf-8", "replace")


def _encode(term: int, holder: str) -> bytes:
    return f"{term}:{holder}".encode()


def _bool(url: str, key: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise InvalidStoreURL(url, f"option {key}={raw!r} is not a boolean")


def _float(url: str, key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError as err:
        raise InvalidStoreURL(url, f"option {key}={raw!r} is not a number") from err
    if not (math.isfinite(value) and value > 0):
        raise InvalidStoreURL(url, f"option {key}={raw!r} must be > 0")
    return value


def _tls_context(url: str, options: dict[str, str]) -> ssl.SSLContext | None:
    tls_keys = {k for k in options if k.startswith("tls")}
    wanted = _bool(url, "tls", options["tls"]) if "tls" in options else bool(tls_keys)
    if not wanted:
        if tls_keys - {"tls"}:
            raise InvalidStoreURL(url, "TLS options given with tls=false")
        return None
    ctx = ssl.create_default_context(cafile=options.get("tls_ca_certs"))
    reqs = options.get("tls_cert_reqs", "required").lower()
    if reqs not in ("none", "optional", "required"):
        raise InvalidStoreURL(url, "tls_cert_reqs must be none, optional or required")
    check_default = "true" if reqs == "required" else "false"
    # check_hostname must go off before verify_mode may become CERT_NONE.
    ctx.check_hostname = _bool(
        url, "tls_check_hostname", options.get("tls_check_hostname", check_default)
    )
    ctx.verify_mode = {
        "none": ssl.CERT_NONE,
        "optional": ssl.CERT_OPTIONAL,
        "required": ssl.CERT_REQUIRED,
    }[reqs]
    if "tls_certfile" in options:
        ctx.load_cert_chain(options["tls_certfile"], options.get("tls_keyfile"))
    elif "tls_keyfile" in options:
        raise InvalidStoreURL(url, "tls_keyfile needs tls_certfile")
    return ctx


class MemcachedElection:
    """An :class:`~quickzones.consumer.election.Election` backed by one memcached server.

    Thread-safe (pymemcache's ``PooledClient``). The returned ``expires_at`` is the injected
    clock's time *before* the request was sent plus ``ttl``; the server keeps the lease at
    least that long, so a holder that stops at ``expires_at`` never overlaps its successor.
    """

    def __init__(
        self,
        client: Any,
        *,
        clock: Clock | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        owns_client: bool = False,
    ) -> None:
        """Wrap a pymemcache client built with ``default_noreply=False`` and no serde.

        ``close`` closes it if owned.
        """
        pymemcache = _import_pymemcache()
        self._client = client
        self._clock: Clock = clock or SystemClock()
        self._prefix = key_prefix
        self._owns_client = owns_client
        exc = pymemcache.exceptions
        # A pooled socket the server closed (restart): safe to redial, see _STALE_RETRIES.
        self._stale: tuple[type[BaseException], ...] = (
            exc.MemcacheUnexpectedCloseError,
            BrokenPipeError,
            ConnectionResetError,
            ConnectionAbortedError,
        )
        # Refused, timed out, server out of memory: the next try may work.
        self._transient: tuple[type[BaseException], ...] = (OSError, exc.MemcacheServerError)
        self._any: tuple[type[BaseException], ...] = (exc.MemcacheError,)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> MemcachedElection:
        """Open ``memcached://host[:port][?options]`` (port defaults to 11211).

        Options: ``timeout`` and ``connect_timeout`` (seconds, default 0.5),
        ``max_pool_size``, ``key_prefix`` (default ``quick:election:``); TLS with ``tls=true``
        or any of ``tls_ca_certs``, ``tls_certfile``, ``tls_keyfile``, ``tls_cert_reqs``
        (none|optional|required, default required), ``tls_check_hostname`` (defaults on
        only with required).
        """
        pymemcache = _import_pymemcache()
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORT
        except ValueError as err:
            raise InvalidStoreURL(url, str(err)) from err
        if parts.scheme.lower() != "memcached":
            raise InvalidStoreURL(url, "expected memcached://host:port")
        if not parts.hostname:
            raise InvalidStoreURL(url, "missing host, e.g. memcached://127.0.0.1:11211")
        if parts.path not in ("", "/"):
            raise InvalidStoreURL(url, "memcached URLs take no path")
        if parts.username or parts.password:
            raise InvalidStoreURL(url, "memcached text protocol has no password; use TLS certs")
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise InvalidStoreURL(url, f"unknown option(s) {', '.join(unknown)}")
        max_pool: int | None = None
        if "max_pool_size" in options:
            try:
                max_pool = int(options["max_pool_size"])
            except ValueError as err:
                raise InvalidStoreURL(url, "max_pool_size must be an integer") from err
        try:
            tls_context = _tls_context(url, options)
        except (OSError, ssl.SSLError) as err:
            raise InvalidStoreURL(url, f"cannot load TLS files: {err}") from err
        client = pymemcache.client.base.PooledClient(
            (parts.hostname, port),
            connect_timeout=_float(url, "connect_timeout", options["connect_timeout"])
            if "connect_timeout" in options
            else DEFAULT_CONNECT_TIMEOUT,
            timeout=_float(url, "timeout", options["timeout"])
            if "timeout" in options
            else DEFAULT_TIMEOUT,
            max_pool_size=max_pool,
            default_noreply=False,
            tls_context=tls_context,
        )
        key_prefix = options.get("key_prefix", DEFAULT_KEY_PREFIX)
        return cls(client, clock=clock, key_prefix=key_prefix, owns_client=True)

    # --- Election -------------------------------------------------------------------

    def try_acquire(self, name: str, holder: str, ttl: float) -> Leadership | None:
        """Take the lease if free (new, larger term) or extend it if ``holder`` has it."""
        _check_ids(name, holder)
        expire = server_expiry(ttl)
        start = self._clock.now()
        key = self._key(name)
        placeholder = _encode(_PLACEHOLDER_TERM, holder)
        value, token = self._call("acquire", name, lambda: self._client.gets(key))
        current = _parse(value)
        if value is not None:
            if current is None or current[1] != holder:
                return None
            term = current[0]
            if term != _PLACEHOLDER_TERM:
                # Already ours (e.g. a retry after a lost reply): extend, keep the term.
                if self._cas(name, key, value, token, expire) is not True:
                    return None
                return Leadership(name, holder, term, start + ttl)
            # Our own placeholder from an attempt that stopped half-way: finish it.
        elif not self._call(
            "acquire", name, lambda: self._client.add(key, placeholder, expire, noreply=False)
        ):
            return None  # another candidate won the race
        term = self._next_term(name)
        value, token = self._call("acquire", name, lambda: self._client.gets(key))
        if value != placeholder:
            return None  # our placeholder expired and someone else took the lease meanwhile
        if self._cas(name, key, _encode(term, holder), token, expire) is not True:
            return None
        return Leadership(name, holder, term, start + ttl)

    def renew(self, lease: Leadership, ttl: float) -> Leadership | None:
        """Extend the lease to ``ttl`` from now; None if ``lease`` is no longer current."""
        expire = server_expiry(ttl)
        start = self._clock.now()
        key = self._key(lease.name)
        expected = _encode(lease.term, lease.holder)
        value, token = self._call("renew", lease.name, lambda: self._client.gets(key))
        if value != expected:
            return None
        if self._cas(lease.name, key, expected, token, expire) is not True:
            return None
        return Leadership(lease.name, lease.holder, lease.term, start + ttl)

    def release(self, lease: Leadership) -> bool:
        """Give the lease up at once; False if ``lease`` was no longer current."""
        key = self._key(lease.name)
        expected = _encode(lease.term, lease.holder)
        value, token = self._call("release", lease.name, lambda: self._client.gets(key))
        if value != expected:
            return False
        # A negative exptime stores the item already expired: a delete guarded by the CAS.
        return self._cas(lease.name, key, b"", token, -1) is True

    def close(self) -> None:
        """Close the pooled connections if this election opened the client."""
        if self._owns_client:
            self._client.close()

    # --- internals ------------------------------------------------------------------

    def _key(self, name: str) -> str:
        key = self._prefix + name
        raw = key.encode()
        if (
            len(raw) + len(_TERM_SUFFIX) > _MAX_KEY_BYTES
            or not raw.isascii()
            or any(b <= 32 or b == 127 for b in raw)
        ):
            key = self._prefix + "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        return key

    def _cas(self, name: str, key: str, value: bytes, token: Any, expire: int) -> bool | None:
        """pymemcache's cas: True stored, False changed since ``gets``, None gone."""
        result: bool | None = self._call(
            "cas", name, lambda: self._client.cas(key, value, token, expire, noreply=False)
        )
        return result

    def _next_term(self, name: str) -> int:
        """Draw the next fencing term, re-seeding the counter from the clock if it is gone."""
        counter = self._key(name) + _TERM_SUFFIX

        def incr() -> int | None:
            got: int | None = self._client.incr(counter, 1, noreply=False)
            return got

        term = self._call("term", name, incr)
        if term is None:
            seed = str(self._seed_us(name))
            # add, not set: if another candidate seeded first, keep its counter.
            self._call("term", name, lambda: self._client.add(counter, seed, 0, noreply=False))
            term = self._call("term", name, incr)
        if term is None:
            raise StorageError(
                f"memcached election term counter for {name!r} vanished twice", retryable=True
            )
        return int(term)

    def _seed_us(self, name: str) -> int:
        # Real wall time, not the injected clock: terms must outlast any test clock.
        local_us = time.time_ns() // 1000
        stats = self._call("stats", name, lambda: self._client.stats())
        server_s = stats.get(b"time") if isinstance(stats, dict) else None
        server_us = int(server_s) * 1_000_000 if isinstance(server_s, int) else 0
        return max(local_us, server_us)

    def _call(self, op: str, name: str, fn: Callable[[], T]) -> T:
        """Run one driver call, redialling stale sockets, mapping errors to StorageError."""
        for attempt in range(_STALE_RETRIES + 1):
            try:
                return fn()
            except self._stale as err:
                if attempt == _STALE_RETRIES:
                    raise StorageError(
                        f"memcached election {op} {name!r}: {err!r}", retryable=True
                    ) from err
            except self._transient as err:
                raise StorageError(
                    f"memcached election {op} {name!r}: {err!r}", retryable=True
                ) from err
            except self._any as err:
                raise StorageError(
                    f"memcached election {op} {name!r}: {err!r}", retryable=False
                ) from err
        raise AssertionError("unreachable")
