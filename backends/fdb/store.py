"""FDBStore: the KV seam over the official ``foundationdb`` binding.

Thin by design: each seam call is one binding call, plus two translations:

* ``fdb.FDBError`` becomes :class:`quickzones.store.kv.KVError` with the same code, the binding's
  error kept as ``__cause__``;
* with a ``root`` or ``directory`` prefix, keys gain the prefix on the way in and lose it on
  the way out (a versionstamped key's offset moves by the prefix length).

The binding module is injectable (``fdb_module``), so the same code runs over
``quickzones.backends.fdb.sim`` in every CI run and over libfdb_c against a real cluster.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from quickzones.backends.fdb import waits
from quickzones.backends.fdb.loader import import_binding, select_api_version
from quickzones.backends.fdb.url import FDBOptions, parse_fdb_url
from quickzones.backends.fdb.wake_watch import ONE, WAKE_KEY, WakeWatch
from quickzones.clock import Clock
from quickzones.errors import ConfigurationError, InvalidArgument, StorageError
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    INVALID_ARGUMENT,
    KEY_OUTSIDE_LEGAL_RANGE,
    KEY_SIZE_LIMIT,
    KEY_TOO_LARGE,
    VALUE_SIZE_LIMIT,
    VALUE_TOO_LARGE,
    KVError,
)

_SYSTEM = b"\xff"


def _description(err: BaseException) -> str:
    try:
        text = getattr(err, "description", "")
    except Exception:  # the description is fetched from libfdb_c; never let it mask err
        return ""
    if isinstance(text, bytes):
        return text.decode("utf-8", "replace")
    return str(text or "")


class _Translate:
    """Turns the binding's FDBError into KVError(code), keeping it as ``__cause__``:
    ``with self._translate():``. A plain class, not a ``@contextmanager`` generator: it is
    entered for every binding call, and a generator costs microseconds each time. The
    hottest calls (point reads, writes, commit) inline the same ``try``/``except`` and
    call :meth:`error`."""

    __slots__ = ("error_type",)

    def __init__(self, error_type: type[BaseException]) -> None:
        self.error_type = error_type

    def __call__(self) -> _Translate:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, err: BaseException | None, tb: Any) -> None:
        if err is not None and isinstance(err, self.error_type):
            raise self.error(err) from err

    @staticmethod
    def error(err: BaseException) -> KVError:
        return KVError(int(getattr(err, "code", 0)), _description(err))


# FDB's inverted_range (the simulator's buffer names it too; kv.py does not).
INVERTED_RANGE = 2005


def _check_stamp_offset(offset: int, length: int, what: str) -> None:
    # libfdb_c accepts the call and fails the whole commit with 2000 (seen on 7.3.79); the
    # seam reports it at the call, where the simulator and the other stores do, so the
    # caller learns which write was wrong and the transaction stays usable.
    if offset + 10 > length:
        raise KVError(
            INVALID_ARGUMENT,
            f"versionstamp offset {offset} + 10 bytes runs past the end of the {length}-byte "
            f"{what}",
        )


class FDBVersionstamp:
    """``tr.get_versionstamp()``: the binding's Key future, read after commit."""

    __slots__ = ("_future", "_translate")

    def __init__(self, future: Any, translate: _Translate) -> None:
        self._future = future
        self._translate = translate

    def result(self) -> bytes:
        with self._translate():
            stamp: bytes = self._future.wait().value
        return stamp


class FDBTransaction:
    """One binding ``Transaction`` behind the KV seam. Not thread-safe, like the binding's.

    No ``__slots__``: tests wrap single methods of a transaction to count its reads.
    """

    def __init__(
        self,
        tr: Any,
        translate: _Translate,
        *,
        prefix: bytes,
        causal_read_risky: bool,
        snapshot_reads: bool = True,
        wake_key: bytes | None = None,
    ) -> None:
        self._tr = tr
        # The store's wake key (its prefix included), where idle consumers watch it.
        self._wake_key = wake_key
        self._translate = translate
        self._error_type = translate.error_type
        self._prefix = prefix
        self._causal_read_risky = causal_read_risky
        # Off: the core's snapshot reads become ordinary reads with read conflicts (to
        # measure what snapshots save, or to rule them out when chasing a bug).
        self._snapshot_reads = snapshot_reads
        self._on_commit: list[Callable[[], None]] = []
        # What this transaction versionstamped (caller's keys, before the prefix): values
        # at these keys, keys in these ranges. Reading them is 1036 (accessed_unreadable),
        # and libfdb_c then fails the whole commit with 1036 too; the seam, like every
        # other store, reports 1036 at the read and leaves the transaction committable,
        # so such reads are answered here and never reach the binding.
        self._vs_values: set[bytes] = set()
        self._vs_ranges: list[tuple[bytes, bytes]] = []

    # --- key prefixing ---------------------------------------------------------------------

    def _key(self, key: bytes) -> bytes:
        if not isinstance(key, bytes):
            raise InvalidArgument("key", key, f"must be bytes, not {type(key).__name__}")
        if not self._prefix:
            return key
        # Under a prefix the binding would accept prefix + b"\xff..."; refuse it as FDB
        # refuses b"\xff..." so the seam means the same with and without a prefix.
        if key.startswith(_SYSTEM):
            raise KVError(KEY_OUTSIDE_LEGAL_RANGE, f"key {key[:20]!r} is in the system keyspace")
        return self._prefix + key

    def _write_key(self, key: bytes) -> bytes:
        """The final key of a write, checked now rather than at the next wait().

        libfdb_c defers a rejected write's error to the transaction's next future (and
        then fails the commit); the seam, like the simulator and SQLite, reports it at the
        call, which is where the caller can still do something about it.
        """
        full = self._key(key)
        if full >= _SYSTEM:
            raise KVError(KEY_OUTSIDE_LEGAL_RANGE, f"key {key[:20]!r} is in the system keyspace")
        if len(full) > KEY_SIZE_LIMIT:
            raise KVError(KEY_TOO_LARGE, f"key of {len(full)} bytes exceeds {KEY_SIZE_LIMIT}")
        return full

    @staticmethod
    def _value(value: bytes) -> bytes:
        if not isinstance(value, bytes):
            raise InvalidArgument("value", value, f"must be bytes, not {type(value).__name__}")
        if len(value) > VALUE_SIZE_LIMIT:
            raise KVError(
                VALUE_TOO_LARGE, f"value of {len(value)} bytes exceeds {VALUE_SIZE_LIMIT}"
            )
        return value

    def _bound(self, bound: bytes) -> bytes:
        # b"\xff" is a legal range bound (the end of the user keyspace); under a prefix it
        # is the end of the prefix's range.
        if self._prefix and bound == _SYSTEM:
            return self._prefix + _SYSTEM
        return self._key(bound)

    def _strip(self, key: bytes) -> bytes:
        return key[len(self._prefix) :] if self._prefix else key

    # --- reads -----------------------------------------------------------------------------

    def _unreadable_spans(self, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The parts of ``[begin, end)`` this transaction made unreadable."""
        spans = [(k, k + b"\x00") for k in self._vs_values if begin <= k < end]
        spans += [(lo, hi) for lo, hi in self._vs_ranges if lo < end and begin < hi]
        return spans

    def _readable_part(
        self, begin: bytes, end: bytes, limit: int, reverse: bool
    ) -> tuple[bytes, bytes] | None:
        """Where a range read must stop to stay readable, or None if it need not.

        Like libfdb_c, a read is refused (1036) only if it reaches an unreadable key: one
        whose limit is met before the first such key (from its end, reversed) returns."""
        spans = self._unreadable_spans(begin, end)
        if not spans:
            return None
        if limit == 0:
            raise KVError(ACCESSED_UNREADABLE, "range holds a key versionstamped in this txn")
        if reverse:
            return max(begin, max(hi for _, hi in spans)), end
        return begin, min(end, min(lo for lo, _ in spans))

    def _forget_stamps(self) -> None:
        self._vs_values.clear()
        self._vs_ranges.clear()

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        if (self._vs_values or self._vs_ranges) and self._unreadable_spans(key, key + b"\x00"):
            raise KVError(ACCESSED_UNREADABLE, "value was versionstamped in this transaction")
        reader = self._tr.snapshot if snapshot and self._snapshot_reads else self._tr
        try:
            value = reader.get(self._key(key)).wait()
            if not value.present():
                return None
            result: bytes = value.value
            return result
        except self._error_type as err:
            raise _Translate.error(err) from err

    def get_many(self, keys: Sequence[bytes], *, snapshot: bool = False) -> list[bytes | None]:
        """Values of ``keys``, read in parallel: every read is sent before any is awaited,
        so a batch costs one round trip, not one per key
        (see :func:`quickzones.store.kv.get_many`)."""
        if self._vs_values or self._vs_ranges:
            return [self.get(k, snapshot=snapshot) for k in keys]
        reader = self._tr.snapshot if snapshot and self._snapshot_reads else self._tr
        key = self._key
        try:
            futures = [reader.get(key(k)) for k in keys]
            if futures:
                # Wait for the last one first: replies come back about in the order sent,
                # so the others are then ready and are read without the binding's
                # callback (one call into Python on the network thread per future waited
                # while not ready, each taking the GIL).
                futures[-1].block_until_ready()
            out: list[bytes | None] = []
            for f in futures:
                value = f.wait()
                out.append(value.value if value.present() else None)
            return out
        except self._error_type as err:
            raise _Translate.error(err) from err

    def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        part = None
        if (self._vs_values or self._vs_ranges) and begin < end:
            part = self._readable_part(begin, end, limit, reverse)
            if part is not None:
                begin, end = part
        reader = self._tr.snapshot if snapshot and self._snapshot_reads else self._tr
        with self._translate():
            # to_list() asks for exact/want_all batches: the whole answer in as few round
            # trips as possible, and the read conflict range covers just what was returned.
            rows = reader.get_range(
                self._bound(begin), self._bound(end), limit=limit, reverse=reverse
            ).to_list()
        if part is not None and len(rows) < limit:
            raise KVError(ACCESSED_UNREADABLE, "range holds a key versionstamped in this txn")
        return [(self._strip(kv.key), kv.value) for kv in rows]

    def get_read_version(self) -> int:
        with self._translate():
            version: int = self._tr.get_read_version().wait()
        return version

    # --- writes ----------------------------------------------------------------------------

    def set(self, key: bytes, value: bytes) -> None:
        try:
            self._tr.set(self._write_key(key), self._value(value))
        except self._error_type as err:
            raise _Translate.error(err) from err
        # A set over a versionstamped value leaves it unreadable (FDB 7.3); a clear does not.

    def clear(self, key: bytes) -> None:
        try:
            self._tr.clear(self._write_key(key))
        except self._error_type as err:
            raise _Translate.error(err) from err
        if self._vs_values:
            self._vs_values.discard(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        # libfdb_c takes an inverted range and fails the transaction's next future and its
        # commit with 2005 (seen on 7.3.79); the seam reports it at the call, like the
        # other rejected writes, and the transaction stays usable.
        if isinstance(begin, bytes) and isinstance(end, bytes) and begin > end:
            raise KVError(INVERTED_RANGE, f"clear_range begin {begin[:20]!r} > end {end[:20]!r}")
        with self._translate():
            self._tr.clear_range(self._bound(begin), self._bound(end))
        if self._vs_values or self._vs_ranges:
            self._vs_values = {k for k in self._vs_values if not begin <= k < end}
            # A versionstamped key bound to land inside the cleared range is gone.
            self._vs_ranges = [r for r in self._vs_ranges if not (begin <= r[0] and r[1] <= end)]

    def add(self, key: bytes, param: bytes) -> None:
        try:
            self._tr.add(self._write_key(key), self._value(param))
        except self._error_type as err:
            raise _Translate.error(err) from err

    def max(self, key: bytes, param: bytes) -> None:
        with self._translate():
            self._tr.max(self._write_key(key), self._value(param))

    def min(self, key: bytes, param: bytes) -> None:
        with self._translate():
            self._tr.min(self._write_key(key), self._value(param))

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        if not isinstance(key, bytes) or len(key) < 4:
            raise KVError(INVALID_ARGUMENT, "a versionstamped key ends with a 4-byte offset")
        # The trailing LE uint32 offset counts from the start of the final key, so under a
        # prefix it moves by the prefix length.
        (offset,) = struct.unpack("<I", key[-4:])
        _check_stamp_offset(offset, len(key) - 4, "key")
        body = key[:-4]
        key = self._write_key(body) + struct.pack("<I", offset + len(self._prefix))
        with self._translate():
            self._tr.set_versionstamped_key(key, self._value(value))
        head, tail = body[:offset], body[offset + 10 :]
        self._vs_ranges.append((head + b"\x00" * 10 + tail, head + b"\xff" * 10 + tail + b"\x00"))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        if not isinstance(value, bytes) or len(value) < 4:
            raise KVError(INVALID_ARGUMENT, "a versionstamped value ends with a 4-byte offset")
        (offset,) = struct.unpack("<I", value[-4:])
        _check_stamp_offset(offset, len(value) - 4, "value")
        with self._translate():
            self._tr.set_versionstamped_value(self._write_key(key), self._value(value))
        self._vs_values.add(key)

    def get_versionstamp(self) -> FDBVersionstamp:
        with self._translate():
            return FDBVersionstamp(self._tr.get_versionstamp(), self._translate)

    # --- conflict ranges -------------------------------------------------------------------

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        with self._translate():
            self._tr.add_read_conflict_range(self._bound(begin), self._bound(end))

    def add_read_conflict_key(self, key: bytes) -> None:
        with self._translate():
            self._tr.add_read_conflict_key(self._key(key))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        with self._translate():
            self._tr.add_write_conflict_range(self._bound(begin), self._bound(end))

    def add_write_conflict_key(self, key: bytes) -> None:
        with self._translate():
            self._tr.add_write_conflict_key(self._key(key))

    # --- commit and retry ------------------------------------------------------------------

    def commit(self) -> None:
        try:
            self._tr.commit().wait()
        except self._error_type as err:
            raise _Translate.error(err) from err
        callbacks, self._on_commit = self._on_commit, []
        for callback in callbacks:
            callback()

    def on_commit(self, callback: Callable[[], None]) -> None:
        self._on_commit.append(callback)

    def wake_watchers_on_commit(self) -> None:
        """Bump the store's wake key with this commit (:mod:`.wake_watch`): an atomic add,
        no read, so it conflicts with nothing."""
        if self._wake_key is not None:
            with self._translate():
                self._tr.add(self._wake_key, ONE)

    def on_error(self, error: KVError) -> None:
        """Back off and reset if retryable (libfdb_c decides); otherwise re-raise ``error``."""
        self._on_commit = []  # this attempt's writes are gone; a retry registers again
        if not isinstance(error, KVError):
            raise error
        self._forget_stamps()  # on_error resets the transaction (or it is finished)
        try:
            with self._translate():
                self._tr.on_error(error.code).wait()
        except KVError as err:
            # The binding re-raises the same code when it will not retry (not retryable, or
            # the retry limit is reached): hand back the caller's own error object.
            if err.code == error.code:
                raise error from None
            raise

    def reset(self) -> None:
        self._on_commit = []
        with self._translate():
            self._tr.reset()
        self._forget_stamps()

    def cancel(self) -> None:
        self._on_commit = []
        with self._translate():
            self._tr.cancel()

    def get_committed_version(self) -> int:
        with self._translate():
            version: int = self._tr.get_committed_version()
        return version

    # --- options ---------------------------------------------------------------------------

    def set_timeout(self, millis: int) -> None:
        if millis < 0:
            raise InvalidArgument("timeout", millis, "must be >= 0 (0 disables it)")
        with self._translate():
            self._tr.options.set_timeout(millis)

    def set_retry_limit(self, limit: int) -> None:
        with self._translate():
            self._tr.options.set_retry_limit(limit)

    def set_max_retry_delay(self, millis: int) -> None:
        with self._translate():
            self._tr.options.set_max_retry_delay(millis)

    def set_causal_read_risky(self) -> None:
        """The core asks only for peeks and pointer leases; the store may decline."""
        if self._causal_read_risky:
            with self._translate():
                self._tr.options.set_causal_read_risky()


class FDBStore:
    """A FoundationDB database behind the KV seam: ``FDBStore.from_url("fdb://")``.

    ``fdb_module`` is the binding (``import fdb`` by default) or ``quickzones.backends.fdb.sim``'s
    stand-in. Opening selects the API version once per process, opens the database, applies
    the database-wide transaction defaults and resolves the key prefix.
    """

    def __init__(
        self,
        options: FDBOptions | None = None,
        *,
        fdb_module: Any = None,
        url: str = "fdb://",
        clock: Clock | None = None,
    ) -> None:
        self.options = options if options is not None else FDBOptions()
        self.url = url
        # Real FDB keeps its own time; the clock matters only to the simulator, which got it
        # when it was built. Kept for symmetry with the other stores.
        self.clock = clock
        fdb = fdb_module if fdb_module is not None else import_binding()
        self.fdb: Any = fdb
        self.api_version = select_api_version(fdb, self.options.api_version)
        waits.install(fdb)  # after the version: that loads fdb.impl
        self._translate = _Translate(fdb.FDBError)
        self.cluster_file = self.options.cluster_file
        with self._translate():
            self.db: Any = fdb.open(self.cluster_file)
            self._apply_database_options()
        self.prefix = self._resolve_prefix()
        self._closed = False
        # Watches need libfdb_c: the simulator's binding has none (its consumers are all in
        # one process, woken by their own enqueues).
        self._wake: WakeWatch | None = None
        if getattr(fdb, "impl", None) is not None:
            self._wake = WakeWatch(self.db, self.prefix + WAKE_KEY, fdb.FDBError)

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None) -> FDBStore:
        """``fdb://[/path/to/fdb.cluster][?options]``, or ``fdbsim://[name]`` (simulator)."""
        parsed = parse_fdb_url(url)
        fdb_module = None
        if parsed.sim_url is not None:
            from quickzones.backends.fdb.sim import sim_module
            from quickzones.backends.memory import MemoryStore

            fdb_module = sim_module(MemoryStore.from_url(parsed.sim_url, clock=clock))
        return cls(parsed.options, fdb_module=fdb_module, url=url, clock=clock)

    def _apply_database_options(self) -> None:
        # Database options become every transaction's defaults and are re-applied by the
        # client on reset(), so they hold for the whole retry loop of run().
        opts = self.options
        db_options = self.db.options
        if opts.timeout_ms is not None:
            db_options.set_transaction_timeout(opts.timeout_ms)
        if opts.retry_limit is not None:
            db_options.set_transaction_retry_limit(opts.retry_limit)
        if opts.max_retry_delay_ms is not None:
            db_options.set_transaction_max_retry_delay(opts.max_retry_delay_ms)
        # causal_read_risky is deliberately never a database option: only the transactions
        # the core marks (peeks, pointer leases) may read a possibly stale version.

    def _resolve_prefix(self) -> bytes:
        if not self.options.directory:
            return self.options.root
        path = self.options.directory
        try:
            with self._translate():
                subspace = self.fdb.directory.create_or_open(self.db, path)
        except KVError as err:
            raise ConfigurationError(
                f"cannot open directory {'/'.join(path)!r} in {self.url}: {err}"
            ) from err
        prefix: bytes = subspace.key()
        return prefix

    def with_options(self, **changes: Any) -> FDBStore:
        """A second store on the same binding with some options changed (tests, tools)."""
        return FDBStore(
            replace(self.options, **changes), fdb_module=self.fdb, url=self.url, clock=self.clock
        )

    def create_transaction(self) -> FDBTransaction:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        with self._translate():
            tr = self.db.create_transaction()
        return FDBTransaction(
            tr,
            self._translate,
            prefix=self.prefix,
            causal_read_risky=self.options.causal_read_risky,
            snapshot_reads=self.options.snapshot_reads,
            wake_key=None if self._wake is None else self._wake.key,
        )

    # --- wake-ups (quickzones.store.kv.CommitCounter, through wake_watch) -------------------

    # Properties, None on the simulator's binding: quickzones.store.kv.commit_counter_of
    # and commit_waiter_of find the capability only where a watch can serve it.
    @property
    def data_version(self) -> Callable[[], int] | None:
        """How many times the wake key changed since this store first watched it (an
        enqueue made a zone active somewhere, :mod:`.wake_watch`), read from memory; the
        first call starts the watch. None where the binding has no watches."""
        return None if self._wake is None else self._wake.count

    @property
    def wait_for_commits(self) -> Callable[[float], None] | None:
        """``wait_for_commits(timeout_s)``: return when the wake key changed, or after
        ``timeout_s``. None where the binding has no watches."""
        return None if self._wake is None else self._wake.wait

    @property
    def commits_signalled(self) -> bool:
        """Whether a change of the wake key ends :meth:`wait_for_commits` now."""
        return self._wake is not None and self._wake.signalled

    def close(self) -> None:
        """Stop handing out transactions and the wake key's watch. The binding caches one
        Database per cluster file for the whole process and stops its network thread at
        exit, so there is nothing else to free here."""
        self._closed = True
        if self._wake is not None:
            self._wake.close()

    def __repr__(self) -> str:
        return f"FDBStore({self.url!r}, api_version={self.api_version}, prefix={self.prefix!r})"
