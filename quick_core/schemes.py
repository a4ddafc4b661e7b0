"""URL schemes: a registry of store and election implementations that they fill themselves.

The core names no backend. An implementation declares its schemes as entry points: group
``quickzones.stores`` for KV stores, ``quickzones.elections`` for scanner elections; each
entry names a factory ``(url, *, clock=None)`` (this package's own are in
``pyproject.toml``). A third party adds a scheme the same way from its own distribution::

    [project.entry-points."quickzones.stores"]
    mykv = "mykv.quick:open_store"

or at run time with :func:`register_store_scheme` / :func:`register_election_scheme`. An
entry point is loaded only when a URL with its scheme is opened, so opening ``memory://``
imports neither SQLite nor a FoundationDB binding, and ``import quickzones`` imports no
driver at all. :mod:`quickzones.urls` parses the URL and asks this module for the factory.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol

from quickzones.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidStoreURL,
    MissingDependency,
)

if TYPE_CHECKING:
    from quickzones.clock import Clock
    from quickzones.consumer.election import Election
    from quickzones.store.kv import KVStore

__all__ = [
    "ELECTIONS",
    "REMOTE_WORKERS",
    "STORES",
    "ElectionFactory",
    "StoreFactory",
    "accepts_create",
    "election_schemes",
    "register_election_scheme",
    "register_store_scheme",
    "store_schemes",
]

STORES = "quickzones.stores"
ELECTIONS = "quickzones.elections"
# ``quick worker --remote URL``: the handlers run in this process and items are leased
# through a server at URL; the HTTP adapter registers ``http`` and ``https``.
REMOTE_WORKERS = "quickzones.remote_workers"
_KIND = {STORES: "store", ELECTIONS: "election", REMOTE_WORKERS: "remote worker"}


class StoreFactory(Protocol):
    """Opens the KV store a URL names; the URL is passed whole, scheme included.

    A store kept in files may also take ``create: bool = True``: ``create=False`` must open
    only an existing store and write nothing (read-only tools pass it). A factory without
    the keyword is always called without it."""

    def __call__(self, url: str, *, clock: Clock | None = None) -> KVStore: ...


class ElectionFactory(Protocol):
    """Opens the scanner election a URL names."""

    def __call__(self, url: str, *, clock: Clock | None = None) -> Election: ...


# urlsplit lowercases the scheme it parses, so a name with a capital could never be opened.
_SCHEME_NAME = re.compile(r"[a-z][a-z0-9+.-]*\Z")

# Reentrant: an implementation module may register schemes while it is being loaded.
_lock = threading.RLock()
# Registered at run time; these win over entry points (only with replace=True for a
# scheme an entry point declares, so a typo cannot silently shadow a backend).
_REGISTERED: dict[str, dict[str, Callable[..., Any]]] = {
    STORES: {},
    ELECTIONS: {},
    REMOTE_WORKERS: {},
}
# Entry points already loaded, so each is imported once.
_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}
# Entry points found in the installed distributions' metadata, read once per group (and
# again when a scheme is missing, in case a distribution was installed since).
_DECLARED: dict[str, dict[str, list[EntryPoint]]] = {}


def register_store_scheme(name: str, factory: StoreFactory, *, replace: bool = False) -> None:
    """Make ``Quick.open("<name>://...")`` call ``factory(url, clock=...)``.

    A scheme already taken (by an entry point or an earlier call) is refused unless
    ``replace=True``."""
    _register(STORES, name, factory, replace)


def register_election_scheme(name: str, factory: ElectionFactory, *, replace: bool = False) -> None:
    """Make ``open_election("<name>://...")`` call ``factory(url, clock=...)``."""
    _register(ELECTIONS, name, factory, replace)


def store_schemes() -> list[str]:
    """Every store scheme that can be opened, sorted (nothing is imported to list them)."""
    return _known(STORES)


def election_schemes() -> list[str]:
    """Every election scheme that can be opened, sorted."""
    return _known(ELECTIONS)


def factory(group: str, scheme: str, url: str) -> Callable[..., Any]:
    """The factory for ``scheme`` in ``group`` (loading its entry point on first use).

    ``url`` is only for the error message of an unknown scheme."""
    with _lock:
        found = _REGISTERED[group].get(scheme) or _LOADED.get((group, scheme))
        if found is not None:
            return found
        candidates = _declared(group).get(scheme)
        if not candidates:
            candidates = _declared(group, refresh=True).get(scheme)
        if not candidates:
            raise InvalidStoreURL(url, _unknown(group, scheme))
        loaded = _load(group, scheme, candidates)
        _LOADED[(group, scheme)] = loaded
        return loaded


def accepts_create(factory: Callable[..., Any]) -> bool:
    """Whether a store factory takes the ``create`` keyword (see :class:`StoreFactory`)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return "create" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _register(group: str, name: str, factory: Any, replace: bool) -> None:
    kind = _KIND[group]
    if not isinstance(name, str) or not _SCHEME_NAME.match(name):
        raise InvalidArgument(
            f"{kind} scheme", name, "expected a URL scheme such as 'mykv' (a lowercase "
            "letter, then lowercase letters, digits, '+', '-' or '.'; no '://')"
        )  # fmt: skip
    if not callable(factory):
        raise InvalidArgument(
            f"{kind} factory", factory, "expected a callable factory(url, *, clock=None)"
        )
    with _lock:
        taken = name in _REGISTERED[group] or name in _declared(group)
        if taken and not replace:
            raise ConfigurationError(
                f"{kind} scheme {name!r} is already registered; pass replace=True to replace it"
            )
        _REGISTERED[group][name] = factory
        _LOADED.pop((group, name), None)


def _known(group: str) -> list[str]:
    with _lock:
        return sorted(set(_REGISTERED[group]) | set(_declared(group)))


def _declared(group: str, *, refresh: bool = False) -> dict[str, list[EntryPoint]]:
    if refresh or group not in _DECLARED:
        table: dict[str, list[EntryPoint]] = {}
        for ep in entry_points(group=group):
            same = table.setdefault(ep.name, [])
            if all(other.value != ep.value for other in same):
                same.append(ep)
        _DECLARED[group] = table
    return _DECLARED[group]


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} from {dist.name}" if dist is not None else ep.value


def _load(group: str, scheme: str, candidates: list[EntryPoint]) -> Callable[..., Any]:
    kind = _KIND[group]
    if len(candidates) > 1:
        # Two distributions claim the scheme: picking one would depend on sys.path order.
        named = "; ".join(_origin(ep) for ep in candidates)
        raise ConfigurationError(
            f"{kind} scheme {scheme!r} is declared by more than one entry point in group "
            f"{group!r} ({named}); uninstall one"
        )
    ep = candidates[0]
    try:
        loaded = ep.load()
    except MissingDependency:
        raise  # it names the extra to install: the clearest thing to say
    except Exception as err:  # the implementation's module failed to import
        raise ConfigurationError(
            f"{kind} scheme {scheme!r} (entry point {_origin(ep)}) failed to load: "
            f"{type(err).__name__}: {err}"
        ) from err
    if not callable(loaded):
        raise ConfigurationError(
            f"{kind} scheme {scheme!r} (entry point {_origin(ep)}) is not a factory "
            f"(got {type(loaded).__name__})"
        )
    return loaded  # type: ignore[no-any-return]


def _unknown(group: str, scheme: str) -> str:
    names = sorted(set(_REGISTERED[group]) | set(_declared(group)))
    if not names:
        # This package declares its own schemes as entry points, so an empty list means its
        # installed metadata predates them.
        return (
            f"unknown scheme {scheme!r}: no {_KIND[group]} schemes are registered, so the "
            f"installed quickzones metadata has no {group!r} entry points (reinstall it: "
            "pip install quickzones, or pip install -e . in a checkout)"
        )
    known = ", ".join(f"{name}://" for name in names)
    return f"unknown scheme {scheme!r}; expected one of {known}"
