"""Bearer tokens for ``quick serve``: each scoped to one app (or, made on purpose with
:meth:`TokenStore.create_for_all_apps`, to every app) and to roles, stored hashed in the
quick store itself.

A token's app is an app name, checked as an enqueue checks one; ``*`` is refused as one
(it reads as "every app" to people). Every-app tokens are marked by a field of their
own (``all_apps``), so a ``*`` stored as a token's app, by a version before this rule,
is never read as every app: such a token acts on no app.

A token reads ``qz_<token_id>_<secret>``. The store keeps, under
``(root, "m", "serve-token", token_id)``, the SHA-256 of the whole token with its app,
roles, label and creation time; never the token. The secret has 256 bits from
``secrets``, so a plain hash is enough (no password stretching is needed for a value
nobody chose), and the check compares digests with :func:`hmac.compare_digest`.

A server's :class:`TokenStore` keeps each valid token's record for ``cache_s`` seconds
(keyed by the token's digest), so a busy consumer's requests do not each read the store;
a revocation by another process (``quick tokens revoke``) takes effect within that time,
one through the same store at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from quickzones.clock import Clock, ElapsedClock, now_ms
from quickzones.errors import InvalidArgument, QuickError
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.pages import DEFAULT_LIMIT, Page, read_all, read_page
from quickzones.store.validation import check_name

# "view": signs in to the dashboard read-only (every page, no control); "admin" acts.
ROLES = ("produce", "consume", "admin", "view")
ALL_APPS = "*"  # how an every-app token's app is shown, and a lease asks for every app
_PREFIX = "qz_"
_META = "serve-token"
_CACHED_MAX = 10_000  # tokens a cache keeps (then starts over)
# Tokens :meth:`TokenStore.admitted` remembers, the most recently admitted kept.
_ADMITTED_MAX = 10_000


class TokenNotFound(QuickError, LookupError):
    """No token with this id."""

    def __init__(self, token_id: str) -> None:
        self.token_id = token_id
        super().__init__(f"no token with id {token_id!r}")


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A stored token, without its secret."""

    token_id: str
    app: str
    roles: tuple[str, ...]
    label: str
    created_ms: int
    all_apps: bool = False  # made with create_for_all_apps; then ``app`` is ALL_APPS

    def allows_app(self, app: str) -> bool:
        # A stored app "*" without the all_apps mark matches no app: not even one named "*".
        return self.all_apps or (self.app == app and app != ALL_APPS)

    def has_role(self, role: str) -> bool:
        return role in self.roles


def check_roles(roles: object) -> tuple[str, ...]:
    if isinstance(roles, str) or not isinstance(roles, list | tuple) or not roles:
        raise InvalidArgument("roles", roles, f"must be a non-empty list of {', '.join(ROLES)}")
    for role in roles:
        if role not in ROLES:
            raise InvalidArgument("roles", role, f"is not one of {', '.join(ROLES)}")
    return tuple(sorted(set(roles), key=ROLES.index))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenStore:
    """Create, list, revoke and check tokens kept in a quick store's KV.

    With ``cache_s`` > 0, :meth:`check` admits a token it found valid within the last
    ``cache_s`` seconds without reading the store again (a revocation elsewhere takes
    effect within ``cache_s``); unknown and wrong tokens are never cached."""

    def __init__(self, kv: KVStore, keys: KeySpace, clock: Clock, *, cache_s: float = 0.0) -> None:
        self.kv = kv
        self.keys = keys
        self.clock = clock
        self.cache_s = cache_s
        self._elapsed: Callable[[], float] = (
            clock.monotonic if isinstance(clock, ElapsedClock) else time.monotonic
        )
        self._cache: dict[str, tuple[float, TokenInfo]] = {}  # digest: (until, info)
        self._cache_lock = threading.Lock()
        # Digests of tokens check() admitted (token_id each), however long ago: only
        # which connections a full server closes first reads it (admitted()).
        self._admitted: OrderedDict[str, str] = OrderedDict()

    def create(
        self, app: str, roles: list[str] | tuple[str, ...], *, label: str = ""
    ) -> tuple[str, TokenInfo]:
        """A new token for the one app ``app`` with ``roles``; returns the token (shown
        once, never stored) and what is stored about it. ``app`` is checked as an enqueue
        checks it, and ``*`` is refused: :meth:`create_for_all_apps` makes such a token."""
        if app == ALL_APPS:
            raise InvalidArgument(
                "app", app, "is not an app name; a token for every app is made with --all-apps"
            )
        return self._create(check_name("app", app), roles, label, all_apps=False)

    def create_for_all_apps(
        self, roles: list[str] | tuple[str, ...], *, label: str = ""
    ) -> tuple[str, TokenInfo]:
        """A new token for every app (an operator's) with ``roles``."""
        return self._create(ALL_APPS, roles, label, all_apps=True)

    def _create(
        self, app: str, roles: list[str] | tuple[str, ...], label: str, *, all_apps: bool
    ) -> tuple[str, TokenInfo]:
        if not isinstance(label, str) or len(label) > 200:
            raise InvalidArgument("label", label, "must be text of at most 200 characters")
        info = TokenInfo(
            secrets.token_hex(8), app, check_roles(roles), label, now_ms(self.clock), all_apps
        )
        token = f"{_PREFIX}{info.token_id}_{secrets.token_urlsafe(32)}"
        record = {
            "v": 1,
            "sha256": _digest(token),
            "app": info.app,
            "all_apps": info.all_apps,
            "roles": list(info.roles),
            "label": info.label,
            "created_ms": info.created_ms,
        }
        key = self.keys.meta_key(_META, info.token_id)
        run(self.kv, lambda tr: tr.set(key, json.dumps(record).encode()))
        return token, info

    def page(self, *, limit: int = DEFAULT_LIMIT, cursor: str | None = None) -> Page[TokenInfo]:
        """One page of the tokens by id (ids are random: not by creation), at most
        ``limit`` from ``cursor`` (a page's ``next_cursor``; None: the first page). It
        reads the tokens it shows and the one after them, however many there are;
        :class:`InvalidArgument` for a cursor that is not one of this list's."""
        found = read_page(self.kv, self.keys.meta_key(_META), [self.keys.meta_range(_META)],
                          arity=1, limit=limit, cursor=cursor)  # fmt: skip
        return Page([self._decode(k, v) for k, v in found.rows], found.next_cursor)

    def list(self) -> list[TokenInfo]:
        """Every token by id, read a page at a time."""
        rows = read_all(self.kv, self.keys.meta_key(_META), [self.keys.meta_range(_META)],
                        arity=1)  # fmt: skip
        return [self._decode(k, v) for k, v in rows]

    def _decode(self, key: bytes, raw: bytes) -> TokenInfo:
        return _info(str(self.keys.unpack(key)[-1]), json.loads(raw))

    def revoke(self, token_id: str) -> None:
        """Delete a token; :class:`TokenNotFound` if there is none with this id."""
        check_name("token_id", token_id)
        key = self.keys.meta_key(_META, token_id)

        def remove(tr: KVTransaction) -> None:
            if tr.get(key) is None:
                raise TokenNotFound(token_id)
            tr.clear(key)

        run(self.kv, remove)
        with self._cache_lock:
            for digest, (_, info) in list(self._cache.items()):
                if info.token_id == token_id:
                    del self._cache[digest]
            for digest, admitted_id in list(self._admitted.items()):
                if admitted_id == token_id:
                    del self._admitted[digest]

    def admitted(self, token: str) -> bool:
        """Whether :meth:`check` admitted ``token`` before (and this store did not revoke
        it since); reads no store, so the event loop may ask. Not an authorisation (a
        revocation elsewhere is not seen): a full server closes the connections whose
        token it does not know before those whose token it does
        (:mod:`quickzones.adapters.http.connections`)."""
        if len(token) > 200:
            return False
        digest = _digest(token)
        with self._cache_lock:
            return digest in self._admitted

    def cached(self, token: str) -> TokenInfo | None:
        """The token's record if :meth:`check` admitted it within ``cache_s``; None
        otherwise (not known to be valid: call :meth:`check`). Reads no store."""
        if self.cache_s <= 0 or len(token) > 200:
            return None
        digest = _digest(token)
        with self._cache_lock:
            hit = self._cache.get(digest)
        if hit is None:
            return None
        if self._elapsed() >= hit[0]:
            with self._cache_lock:
                self._cache.pop(digest, None)
            return None
        return hit[1]

    def check(self, token: str) -> TokenInfo | None:
        """The token's stored record if ``token`` is one of ours and not revoked (or, with
        ``cache_s``, was not within the last ``cache_s`` seconds)."""
        hit = self.cached(token)
        if hit is not None:
            return hit
        if not token.startswith(_PREFIX) or len(token) > 200:
            return None
        token_id, sep, _secret = token[len(_PREFIX) :].partition("_")
        if not sep or not token_id or not token_id.isalnum():
            return None
        key = self.keys.meta_key(_META, token_id)
        raw = run(self.kv, lambda tr: tr.get(key, snapshot=True))
        if raw is None:
            # Compare anyway, so an unknown id costs what a known one does.
            hmac.compare_digest(_digest(token), "0" * 64)
            return None
        record = json.loads(raw)
        digest = _digest(token)
        if not hmac.compare_digest(digest, str(record.get("sha256", ""))):
            return None
        info = _info(token_id, record)
        with self._cache_lock:
            self._admitted[digest] = token_id
            self._admitted.move_to_end(digest)
            while len(self._admitted) > _ADMITTED_MAX:
                self._admitted.popitem(last=False)
        if self.cache_s > 0:
            with self._cache_lock:
                if len(self._cache) >= _CACHED_MAX:
                    self._cache.clear()
                self._cache[digest] = (self._elapsed() + self.cache_s, info)
        return info


def _info(token_id: str, record: dict[str, object]) -> TokenInfo:
    roles = record.get("roles", [])
    created = record.get("created_ms", 0)
    return TokenInfo(
        token_id=token_id,
        app=str(record.get("app", "")),
        roles=tuple(str(r) for r in roles) if isinstance(roles, list) else (),
        label=str(record.get("label", "")),
        created_ms=created if isinstance(created, int) else 0,
        all_apps=record.get("all_apps") is True,
    )
