"""A stand-in for the part of the ``fdb`` module that the FDB backend calls, over MemoryStore.

``FDBStore(fdb_module=sim_module(MemoryStore(...)))`` runs the FDB backend's own code
(URL options, key prefixes, error translation, option mapping, on_error delegation) in
every CI run, with the simulator standing in for libfdb_c and a cluster. The surface is
the binding's, call for call:

    fdb.api_version(730); db = fdb.open(cluster_file)
    db.options.set_transaction_timeout(ms) / _retry_limit(n) / _max_retry_delay(ms)
    tr = db.create_transaction()
    tr.get(k).wait().present() / .value        tr.snapshot.get(k)
    tr.get_range(b, e, limit=0, reverse=False).to_list() -> [KeyValue(key, value)]
    tr.set / clear / clear_range / add / max / min / bit_* / byte_* / compare_and_clear
    tr.set_versionstamped_key / _value; tr.get_versionstamp().wait().value
    tr.add_read_conflict_range / _key, tr.add_write_conflict_range / _key
    tr.get_read_version().wait(); tr.commit().wait(); tr.on_error(code).wait()
    tr.reset(); tr.cancel(); tr.get_committed_version()
    tr.options.set_timeout / set_retry_limit / set_max_retry_delay / set_causal_read_risky
    fdb.directory.create_or_open(db, ("app", "quick")).key()
    fdb.FDBError(code)

Like the binding, read and commit futures carry their error until ``wait()``, and a
transaction that read an unreadable key fails its commit with 1036. Unlike it,
the simulator evaluates eagerly and reports write errors (key too large, system keys) at the
call; see docs/fdb.md for every difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from quickzones.backends.memory import MemoryStore, MemoryTransaction
from quickzones.clock import Clock
from quickzones.store.kv import ACCESSED_UNREADABLE, KVError, KVTransaction, run
from quickzones.store.tuple_layer import fdbtuple

if TYPE_CHECKING:
    from quickzones.backends.fdb.store import FDBStore

T = TypeVar("T")

# The client library the simulator pretends to be: libfdb_c 7.3.
MAX_API_VERSION = 730
# Directory metadata lives under \xfe like the real directory layer's node subspace.
_DIRECTORY_NODES = b"\xfe"
_DIRECTORY_COUNTER = _DIRECTORY_NODES + fdbtuple.pack(("\x00hca",))


class FDBError(Exception):
    """The binding's error: ``code`` and ``description``."""

    def __init__(self, code: int, description: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.description = description or f"simulated error {code}"

    def __str__(self) -> str:
        return f"{self.description} ({self.code})"

    def __repr__(self) -> str:
        return f"FDBError({self.code})"


def _call(fn: Callable[[], T]) -> T:
    """Run a MemoryTransaction call, reporting its KVError as the binding would."""
    try:
        return fn()
    except KVError as err:
        raise FDBError(err.code, _detail(err)) from err


def _detail(err: KVError) -> str:
    # str(KVError) is "name (code): detail"; the binding's description is only the text.
    head = f"{err.name} ({err.code})"
    text = str(err)
    return text[len(head) + 2 :] if text.startswith(head + ": ") else err.name


class Future:
    """A ready future: ``wait()`` returns the result or raises the stored FDBError."""

    __slots__ = ("_error", "_result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._result: Any = None
        self._error: FDBError | None = None
        try:
            self._result = _call(fn)
        except FDBError as err:
            self._error = err

    def is_ready(self) -> bool:
        return True

    def wait(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


class Value:
    """``tr.get(k)`` / ``tr.get_versionstamp()``: ``wait()`` returns itself, then ``.value``.

    Evaluated on first use, so a versionstamp future taken before commit reads the stamp
    after it, as the binding's does.
    """

    __slots__ = ("_done", "_error", "_fn", "_value")

    def __init__(self, fn: Callable[[], bytes | None]) -> None:
        self._fn = fn
        self._done = False
        self._value: bytes | None = None
        self._error: FDBError | None = None

    def _resolve(self) -> None:
        if not self._done:
            try:
                self._value = _call(self._fn)
                self._done = True
            except FDBError as err:
                self._error = err
        if self._error is not None:
            raise self._error

    def wait(self) -> Value:
        self._resolve()
        return self

    def block_until_ready(self) -> None:
        """The binding's: returns once the result (or error) is there, raising nothing;
        here it always is (evaluated on first use)."""

    @property
    def value(self) -> bytes | None:
        self._resolve()
        return self._value

    def present(self) -> bool:
        return self.value is not None


class KeyValue:
    """One row of a range read: ``.key``, ``.value``, and ``k, v = kv``."""

    __slots__ = ("key", "value")

    def __init__(self, key: bytes, value: bytes) -> None:
        self.key = key
        self.value = value

    def __iter__(self) -> Iterator[bytes]:
        return iter((self.key, self.value))

    def __repr__(self) -> str:
        return f"{self.key!r}: {self.value!r}"


class Range:
    """``tr.get_range(...)``: iterate it or call ``to_list()``; errors surface there."""

    __slots__ = ("_future",)

    def __init__(self, fn: Callable[[], list[tuple[bytes, bytes]]]) -> None:
        self._future = Future(fn)

    def to_list(self) -> list[KeyValue]:
        rows: list[tuple[bytes, bytes]] = self._future.wait()
        return [KeyValue(k, v) for k, v in rows]

    def __iter__(self) -> Iterator[KeyValue]:
        return iter(self.to_list())


class _Poison:
    """libfdb_c fails the commit of a transaction that read an unreadable key (a value or
    key versionstamped in it) with 1036, though the read already raised 1036 (seen on
    7.3.79; MemoryTransaction lets such a commit through). Shared by ``tr`` and
    ``tr.snapshot``; ``reset``/``on_error`` start clean."""

    __slots__ = ("poisoned",)

    def __init__(self) -> None:
        self.poisoned = False

    def read(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except KVError as err:
            if err.code == ACCESSED_UNREADABLE:
                self.poisoned = True
            raise


class TransactionRead:
    """The read half of a transaction; ``tr.snapshot`` is one with ``snapshot=True``."""

    def __init__(self, tr: MemoryTransaction, snapshot: bool, poison: _Poison) -> None:
        self._mem = tr
        self._snapshot = snapshot
        self._poison = poison

    def get(self, key: bytes) -> Value:
        return Value(lambda: self._poison.read(lambda: self._mem.get(key, snapshot=self._snapshot)))

    def get_range(
        self,
        begin: bytes | None,
        end: bytes | None,
        limit: int = 0,
        reverse: bool = False,
        streaming_mode: int = -1,
    ) -> Range:
        # streaming_mode only changes batching in the binding; one batch here.
        b = b"" if begin is None else begin
        e = b"\xff" if end is None else end
        return Range(
            lambda: self._poison.read(
                lambda: self._mem.get_range(
                    b, e, limit=limit, reverse=reverse, snapshot=self._snapshot
                )
            )
        )

    def get_read_version(self) -> Future:
        return Future(self._mem.get_read_version)


class TransactionOptions:
    """``tr.options``; ``calls`` records every option set, for tests of the mapping."""

    def __init__(self, tr: MemoryTransaction) -> None:
        self._mem = tr
        self.calls: list[tuple[str, int | None]] = []

    def set_timeout(self, millis: int) -> None:
        self.calls.append(("timeout", millis))
        _call(lambda: self._mem.set_timeout(millis))

    def set_retry_limit(self, limit: int) -> None:
        self.calls.append(("retry_limit", limit))
        self._mem.set_retry_limit(limit)

    def set_max_retry_delay(self, millis: int) -> None:
        self.calls.append(("max_retry_delay", millis))
        self._mem.set_max_retry_delay(millis)

    def set_causal_read_risky(self) -> None:
        self.calls.append(("causal_read_risky", None))
        self._mem.set_causal_read_risky()


class Transaction(TransactionRead):
    """``db.create_transaction()``: the binding's Transaction over a MemoryTransaction."""

    def __init__(self, tr: MemoryTransaction, db: Database) -> None:
        poison = _Poison()
        super().__init__(tr, snapshot=False, poison=poison)
        self.db = db
        self.snapshot = TransactionRead(tr, snapshot=True, poison=poison)
        self.options = TransactionOptions(tr)
        db._apply_defaults(self)

    def set(self, key: bytes, value: bytes) -> None:
        _call(lambda: self._mem.set(key, value))

    def clear(self, key: bytes) -> None:
        _call(lambda: self._mem.clear(key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        _call(lambda: self._mem.clear_range(begin, end))

    def _atomic(self, name: str, key: bytes, param: bytes) -> None:
        op = getattr(self._mem, name)
        _call(lambda: op(key, param))

    def add(self, key: bytes, param: bytes) -> None:
        self._atomic("add", key, param)

    def max(self, key: bytes, param: bytes) -> None:
        self._atomic("max", key, param)

    def min(self, key: bytes, param: bytes) -> None:
        self._atomic("min", key, param)

    def bit_and(self, key: bytes, param: bytes) -> None:
        self._atomic("bit_and", key, param)

    def bit_or(self, key: bytes, param: bytes) -> None:
        self._atomic("bit_or", key, param)

    def bit_xor(self, key: bytes, param: bytes) -> None:
        self._atomic("bit_xor", key, param)

    def byte_max(self, key: bytes, param: bytes) -> None:
        self._atomic("byte_max", key, param)

    def byte_min(self, key: bytes, param: bytes) -> None:
        self._atomic("byte_min", key, param)

    def append_if_fits(self, key: bytes, param: bytes) -> None:
        self._atomic("append_if_fits", key, param)

    def compare_and_clear(self, key: bytes, param: bytes) -> None:
        self._atomic("compare_and_clear", key, param)

    def set_versionstamped_key(self, key: bytes, param: bytes) -> None:
        self._atomic("set_versionstamped_key", key, param)

    def set_versionstamped_value(self, key: bytes, param: bytes) -> None:
        self._atomic("set_versionstamped_value", key, param)

    def get_versionstamp(self) -> Value:
        stamp = self._mem.get_versionstamp()
        return Value(stamp.result)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        _call(lambda: self._mem.add_read_conflict_range(begin, end))

    def add_read_conflict_key(self, key: bytes) -> None:
        _call(lambda: self._mem.add_read_conflict_key(key))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        _call(lambda: self._mem.add_write_conflict_range(begin, end))

    def add_write_conflict_key(self, key: bytes) -> None:
        _call(lambda: self._mem.add_write_conflict_key(key))

    def commit(self) -> Future:
        if self._poison.poisoned:
            return Future(_unreadable_commit)
        return Future(self._mem.commit)

    def get_committed_version(self) -> int:
        return self._mem.get_committed_version()

    def on_error(self, error: FDBError | int) -> Future:
        code = error.code if isinstance(error, FDBError) else int(error)
        self._poison.poisoned = False  # on_error resets the transaction (or it is done)
        # MemoryTransaction.on_error re-raises non-retryable errors and those past the retry
        # limit; _call turns that into FDBError(code), as libfdb_c reports it.
        return Future(lambda: self._mem.on_error(KVError(code)))

    def reset(self) -> None:
        self._mem.reset()
        self._poison.poisoned = False
        # The client re-applies database-wide transaction defaults on reset.
        self.db._apply_defaults(self)

    def cancel(self) -> None:
        self._mem.cancel()


def _unreadable_commit() -> None:
    raise KVError(ACCESSED_UNREADABLE, "Read or wrote an unreadable key")


class DatabaseOptions:
    """``db.options``: transaction defaults, applied at creation and on reset."""

    def __init__(self) -> None:
        self.timeout_ms: int | None = None
        self.retry_limit: int | None = None
        self.max_retry_delay_ms: int | None = None
        self.causal_read_risky = False

    def set_transaction_timeout(self, millis: int) -> None:
        self.timeout_ms = millis

    def set_transaction_retry_limit(self, limit: int) -> None:
        self.retry_limit = limit

    def set_transaction_max_retry_delay(self, millis: int) -> None:
        self.max_retry_delay_ms = millis

    def set_transaction_causal_read_risky(self) -> None:
        self.causal_read_risky = True


class Database:
    """``fdb.open()``: hands out transactions over one MemoryStore."""

    def __init__(self, store: MemoryStore, cluster_file: str | None) -> None:
        self.store = store
        self.cluster_file = cluster_file
        self.options = DatabaseOptions()

    def create_transaction(self) -> Transaction:
        return Transaction(self.store.create_transaction(), self)

    def _apply_defaults(self, tr: Transaction) -> None:
        opts = self.options
        # Straight to the MemoryTransaction: defaults are not calls the caller made, so they
        # stay out of tr.options.calls.
        if opts.timeout_ms is not None:
            tr._mem.set_timeout(opts.timeout_ms)
        if opts.retry_limit is not None:
            tr._mem.set_retry_limit(opts.retry_limit)
        if opts.max_retry_delay_ms is not None:
            tr._mem.set_max_retry_delay(opts.max_retry_delay_ms)
        if opts.causal_read_risky:
            tr._mem.set_causal_read_risky()


class DirectorySubspace:
    """What ``create_or_open`` returns; the backend needs only ``key()``."""

    def __init__(self, path: tuple[str, ...], prefix: bytes) -> None:
        self.path = path
        self._prefix = prefix

    def key(self) -> bytes:
        return self._prefix


class DirectoryLayer:
    """``fdb.directory``: allocates a short tuple-encoded integer prefix per path, like the
    real layer's high-contention allocator, and remembers it under ``\\xfe``."""

    def create_or_open(
        self, db_or_tr: Database | Transaction, path: tuple[str, ...], layer: bytes = b""
    ) -> DirectorySubspace:
        node = _DIRECTORY_NODES + fdbtuple.pack(tuple(path))

        def body(tr: KVTransaction) -> bytes:
            existing = tr.get(node)
            if existing is not None:
                return existing
            counter = tr.get(_DIRECTORY_COUNTER)
            n = int.from_bytes(counter, "little") + 1 if counter else 1
            tr.set(_DIRECTORY_COUNTER, n.to_bytes(8, "little"))
            prefix: bytes = fdbtuple.pack((n,))
            tr.set(node, prefix)
            return prefix

        if isinstance(db_or_tr, Transaction):
            prefix = _call(lambda: body(db_or_tr._mem))
        else:
            prefix = _call(lambda: run(db_or_tr.store, body))
        return DirectorySubspace(tuple(path), prefix)


class SimFDB:
    """The module object: pass it as ``FDBStore(fdb_module=...)``."""

    FDBError = FDBError
    KeyValue = KeyValue

    def __init__(self, store: MemoryStore, *, max_api_version: int = MAX_API_VERSION) -> None:
        self.store = store
        self.max_api_version = max_api_version
        self.directory = DirectoryLayer()
        self.opened: list[str | None] = []
        self._version: int | None = None
        self._databases: dict[str | None, Database] = {}

    def api_version(self, version: int) -> None:
        # The binding's own checks and wording (fdb/__init__.py).
        if self._version is not None:
            if self._version != version:
                raise RuntimeError(f"FDB API already loaded at version {self._version}")
            return
        if version > self.max_api_version:
            raise RuntimeError(
                f"API version {version} is not supported by the installed FoundationDB C library."
            )
        self._version = version

    def is_api_version_selected(self) -> bool:
        return self._version is not None

    def get_api_version(self) -> int:
        if self._version is None:
            raise RuntimeError("API version is not set")
        return self._version

    def open(self, cluster_file: str | None = None, event_model: object = None) -> Database:
        if self._version is None:
            raise RuntimeError("You must call api_version() before using any fdb methods")
        self.opened.append(cluster_file)
        # One Database per cluster file, cached for the process, as fdb.open does.
        if cluster_file not in self._databases:
            self._databases[cluster_file] = Database(self.store, cluster_file)
        return self._databases[cluster_file]


def sim_module(store: MemoryStore | None = None, **kwargs: Any) -> SimFDB:
    """An ``fdb`` module stand-in over ``store`` (a fresh MemoryStore by default)."""
    return SimFDB(store if store is not None else MemoryStore(), **kwargs)


def open_sim_store(
    *, clock: Clock | None = None, seed: int = 0, root: bytes = b"", **options: Any
) -> FDBStore:
    """An FDBStore over a fresh simulator: the FDB backend's code without libfdb_c."""
    from quickzones.backends.fdb.store import FDBStore
    from quickzones.backends.fdb.url import FDBOptions

    fdb = sim_module(MemoryStore(seed=seed, clock=clock))
    return FDBStore(FDBOptions(root=root, **options), fdb_module=fdb, url="fdbsim://", clock=clock)
