"""Settings a visit (paper Algorithm 2) obeys, looked up per app and per zone as visits
need them, never loaded as a whole set (issue 43 point 1): pauses (:mod:`.pauses`),
tenant weights (:mod:`.weights`) and per-tenant limits (:mod:`.tenant_limits`).

Each kind keeps its records in the store's meta range, by app and tenant, and beside them
one small head per app, written in the transaction of every change of the app's records
with atomic adds (so changes never conflict on it):

    (root, "m", "settings", kind, app, "n") -> how many of the app's records name a tenant
    (root, "m", "settings", kind, app, "v") -> the app's version, one more at each change

(the app "" holds what applies to every app: a job type paused everywhere).

A reader keeps a bounded cache (:data:`CACHE_MAX` entries a kind, least recently used
dropped first) of what it read: per app its head and its app-wide records, per zone its
tenant's records, each entry with the version it was read at. The app's version is read
again at most once each ``refresh_s``; an entry of an older version is read again when
next needed. So a visit reads nothing while its entries are current, a change in one app
invalidates nothing of another, a zone of an app whose records name no tenant reads no
record of its own, and what a visit costs never grows with how many tenants of how many
apps have settings. A change is seen by every reader within about ``refresh_s``; the
process that makes it sees it at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from quickzones.clock import Clock
from quickzones.store.keys import KeySpace, tuple_range
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64
from quickzones.store.pages import DEFAULT_LIMIT, Page, Span, read_all, read_page
from quickzones.store.records import ZoneId
from quickzones.store.validation import check_name

# Entries a reader keeps of one kind (apps' and zones' together): enough for the zones a
# consumer visits within a refresh; past it the least recently used is read again.
CACHE_MAX = 10_000

K = TypeVar("K")
V = TypeVar("V")
A = TypeVar("A")  # what applies to a whole app
T = TypeVar("T")  # what applies to one tenant
R = TypeVar("R")  # one record, as a list shows it


class Lru(Generic[K, V]):
    """A dict of at most ``size`` entries, the least recently used dropped first; safe
    across threads (a consumer's managers visit concurrently)."""

    def __init__(self, size: int = CACHE_MAX) -> None:
        self.size = size
        self._d: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._d.get(key)
            if found is not None:
                self._d.move_to_end(key)
            return found

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._d.pop(key, None)

    def __len__(self) -> int:
        return len(self._d)


@dataclass(frozen=True, slots=True)
class Head:
    """An app's head as read: its version, and whether any of its records names a tenant."""

    version: int
    tenants: bool


class AppSettings(Generic[A, T, R]):
    """One kind of settings, looked up per app (:meth:`app_part`) and per zone
    (:meth:`tenant_part`), and listed a page at a time (:meth:`page`); a kind says where
    its records live and how to read one app's or one tenant's."""

    kind = ""  # the records' name in the meta range: (root, "m", kind, app, tenant, ...)
    arity = 2  # the elements of a record's key below (root, "m", kind)

    def __init__(
        self,
        kv: KVStore,
        keys: KeySpace,
        clock: Clock,
        refresh_s: float,
        *,
        cache_max: int = CACHE_MAX,
    ) -> None:
        self.kv = kv
        self.keys = keys
        self.clock = clock
        self.refresh_s = refresh_s
        self._heads: Lru[str, tuple[float, Head]] = Lru(cache_max)
        self._apps: Lru[str, tuple[int, A]] = Lru(cache_max)
        self._tenants: Lru[tuple[str, str], tuple[int, T]] = Lru(cache_max)
        # What a kind's zone lookup combined from the entries above (:meth:`_memo`), by
        # app or by zone: (valid until, generation, value); at most ``cache_max``.
        self._memos: dict[str | ZoneId, tuple[float, int, object]] = {}
        self._memo_max = cache_max
        self._generation = 0  # one more at each change this process makes

    # --- what a kind says -------------------------------------------------------------

    def _read_app(self, tr: KVTransaction, app: str) -> A:
        """What applies to every tenant of ``app``, read now (a few records at most)."""
        raise NotImplementedError

    def _read_tenant(self, tr: KVTransaction, app: str, tenant: str) -> T:
        """What applies to ``tenant`` of ``app`` alone, read now."""
        raise NotImplementedError

    def _no_tenant(self) -> T:
        """What a tenant without records of its own has."""
        raise NotImplementedError

    def _decode(self, key: bytes, raw: bytes) -> R:
        """The record stored at ``key``."""
        raise NotImplementedError

    def _spans(self, app: str | None) -> list[Span]:
        """The key ranges, in key order, of what ``app``'s list shows (None: every app's
        records): its own records; a kind adds what applies to every app."""
        return [self.keys.meta_range(self.kind, *(() if app is None else (app,)))]

    # --- writing ----------------------------------------------------------------------

    def _head_key(self, app: str, part: str) -> bytes:
        return self.keys.meta_key("settings", self.kind, app, part)

    def _change(
        self, tr: KVTransaction, app: str, tenant: str | None, key: bytes, value: bytes | None
    ) -> bool:
        """Set (or with None clear) the record at ``key`` of ``app`` (and ``tenant``, None
        for an app-wide record) and bump the app's head in ``tr``; whether a record was
        there before."""
        existed = tr.get(key) is not None
        if value is None:
            if not existed:
                return False
            tr.clear(key)
        else:
            tr.set(key, value)
        if tenant is not None and existed != (value is not None):
            count = self._head_key(app, "n")
            # Read without a conflict: changes of one app's tenants (a bulk pause from
            # many requests) must not serialise on their count, kept by atomic adds.
            if tr.get(count, snapshot=True) is None:
                # A store written before heads were kept: count the app's tenant records
                # once (before this change). With a conflict on the count, so two first
                # changes at once do not both set it.
                tr.add_read_conflict_key(count)
                tr.set(count, pack_i64(self._count_tenant_records(tr, app)))
            tr.add(count, pack_i64(1 if value is not None else -1))
        tr.add(self._head_key(app, "v"), pack_i64(1))
        return existed

    def _changed(self, app: str) -> None:
        """This process sees its own change at once: the app's head is read again."""
        self._generation += 1  # before the pop: a lookup racing the change keeps nothing
        self._memos.clear()
        self._heads.pop(app)

    def _write(self, app: str, tenant: str | None, key: bytes, value: bytes | None) -> bool:
        existed = run(self.kv, lambda tr: self._change(tr, app, tenant, key, value))
        self._changed(app)
        return existed

    def _tenant_records(self, app: str) -> tuple[bytes, bytes]:
        """The range of ``app``'s records that name a tenant (after the app-wide ones,
        whose tenant is "")."""
        app_wide = self.keys.meta_key(self.kind, app, "")
        return app_wide + b"\xff", self.keys.meta_range(self.kind, app)[1]

    def _count_tenant_records(self, tr: KVTransaction, app: str) -> int:
        begin, end = self._tenant_records(app)
        return len(tr.get_range(begin, end))

    # --- reading ----------------------------------------------------------------------

    def _read_head(self, tr: KVTransaction, app: str) -> Head:
        begin, end = tuple_range(self.keys.meta_key("settings", self.kind, app))
        rows = dict(tr.get_range(begin, end, snapshot=True))
        version = unpack_i64(rows.get(self._head_key(app, "v")))
        count = rows.get(self._head_key(app, "n"))
        if count is not None:
            return Head(version, unpack_i64(count) > 0)
        # Never counted (a store written before heads were kept, or no tenant record
        # ever): whether there is one, from the first key of them.
        begin, end = self._tenant_records(app)
        return Head(version, bool(tr.get_range(begin, end, limit=1, snapshot=True)))

    def _head_cached(self, app: str) -> Head | None:
        """``app``'s head as read within the last ``refresh_s`` (None: to be read)."""
        cached = self._heads.get(app)
        if cached is not None and self.clock.now() - cached[0] < self.refresh_s:
            return cached[1]
        return None

    def _head(self, app: str) -> Head:
        """``app``'s head, read again at most once each ``refresh_s``."""
        head = self._head_cached(app)
        if head is None:
            now = self.clock.now()
            head = run(self.kv, lambda tr: self._read_head(tr, app))
            self._heads.put(app, (now, head))
        return head

    def _fresh(self, app: str, read: Callable[[KVTransaction], V]) -> tuple[Head, V]:
        """``read`` with ``app``'s head in one snapshot, so what is read is of that version."""
        now = self.clock.now()
        head, value = run(self.kv, lambda tr: (self._read_head(tr, app), read(tr)))
        self._heads.put(app, (now, head))
        return head, value

    def app_part(self, app: str) -> A:
        """What applies to every tenant of ``app`` (cached; read when its version moved,
        with the head when that is due: one read a refresh)."""
        head = self._head_cached(app)
        cached = self._apps.get(app)
        if head is not None and cached is not None and cached[0] == head.version:
            return cached[1]
        head, value = self._fresh(app, lambda tr: self._read_app(tr, app))
        self._apps.put(app, (head.version, value))
        return value

    def has_tenants(self, app: str) -> bool:
        """Whether any record of ``app`` names a tenant (as last read, within a refresh)."""
        return self._head(app).tenants

    def tenant_part(self, zone: ZoneId) -> T:
        """What applies to ``zone``'s tenant alone: nothing read when no record of its app
        names a tenant; else cached, read when the app's version moved."""
        head = self._head(zone.app)
        if not head.tenants:
            return self._no_tenant()
        name = (zone.app, zone.tenant)
        cached = self._tenants.get(name)
        if cached is not None and cached[0] == head.version:
            return cached[1]
        head, value = self._fresh(zone.app, lambda tr: self._read_tenant(tr, *name))
        self._tenants.put(name, (head.version, value))
        return value

    def _memo(self, zone: ZoneId, apps: tuple[str, ...], lookup: Callable[[ZoneId], V]) -> V:
        """``lookup(zone)``, what a visit asks of this kind for ``zone`` (made of
        :meth:`app_part` of ``apps`` and :meth:`tenant_part`), remembered until the first
        of the heads it rests on is due to be read again (or this process changes a
        record): per app while no record of ``zone.app`` names a tenant (every zone of it
        gets the same), else per zone. So a visit's lookup, and each Worker's start
        check's, is one clock read and a dict read or two, not a head and a record lookup
        per part under the caches' locks; a change is still seen within ``refresh_s``."""
        now = self.clock.now()
        memos, generation = self._memos, self._generation
        for key in (zone.app, zone):
            hit = memos.get(key)
            if hit is not None and now < hit[0] and hit[1] == generation:
                return hit[2]  # type: ignore[return-value]
        names = (*apps, zone.app)
        heads = [self._heads.get(app) for app in names]
        value = lookup(zone)
        # Kept only if every part was worked out against these very heads: a head read
        # again meanwhile (here or by another thread) is a new entry, and the value may
        # rest on another version, or on its tenants where the app's key says none.
        for app, head in zip(names, heads, strict=True):
            if head is None or self._heads.get(app) is not head:
                return value
        until = min(h[0] for h in heads if h is not None) + self.refresh_s
        own = heads[-1]
        assert own is not None
        if len(memos) >= self._memo_max:
            memos.clear()
        memos[zone if own[1].tenants else zone.app] = (until, generation, value)
        return value

    def last_app_part(self, app: str) -> A | None:
        """What :meth:`app_part` last read, however old (None: never read): what a reader
        goes on with while the store cannot be read."""
        cached = self._apps.get(app)
        return None if cached is None else cached[1]

    def last_tenant_part(self, zone: ZoneId) -> T | None:
        cached = self._tenants.get((zone.app, zone.tenant))
        return None if cached is None else cached[1]

    @property
    def cached(self) -> int:
        """How many entries this reader keeps (at most three times ``cache_max``)."""
        return len(self._heads) + len(self._apps) + len(self._tenants)

    # --- listing (the admin's; visits never read it) ------------------------------------

    def page(
        self, app: str | None = None, *, limit: int = DEFAULT_LIMIT, cursor: str | None = None
    ) -> Page[R]:
        """One page of ``app``'s records (None: every app's) in key order (app, tenant,
        ...), from ``cursor`` (a page's ``next_cursor``): at most ``limit`` records and the
        next page's cursor (None: the last page). It reads the records it shows and the
        one after them, however many lie behind (:func:`~quickzones.store.pages.read_page`);
        a cursor that is not one of this list's is :class:`InvalidArgument`."""
        spans = self._spans(None if app is None else check_name("app", app))
        found = read_page(self.kv, self.keys.meta_key(self.kind), spans, arity=self.arity,
                          limit=limit, cursor=cursor)  # fmt: skip
        return Page([self._decode(k, v) for k, v in found.rows], found.next_cursor)

    def list(self) -> list[R]:
        """Every record of every app, read now a page at a time (admin figures)."""
        rows = read_all(self.kv, self.keys.meta_key(self.kind), self._spans(None),
                        arity=self.arity)  # fmt: skip
        return [self._decode(k, v) for k, v in rows]
