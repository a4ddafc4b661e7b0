"""One error tree for the whole library.

Every exception quick raises on purpose derives from :class:`QuickError`, carries its facts
as fields (never only in the message) and says in its name which failure it is.
"""

from __future__ import annotations

from quickzones.handler_meta import check_handler_meta


def redact_url(url: str) -> str:
    """A URL with any password replaced, safe to log or print."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


class QuickError(Exception):
    """Base of every error quick raises on purpose."""


# --- configuration -------------------------------------------------------------------


class ConfigurationError(QuickError):
    """The library was configured wrongly (bad URL, bad parameter, missing driver)."""


class InvalidStoreURL(ConfigurationError):
    """A store URL could not be parsed or names an unknown scheme."""

    def __init__(self, url: str, reason: str) -> None:
        shown = redact_url(url)
        super().__init__(f"invalid store URL {shown!r}: {reason}")
        self.url = shown
        self.reason = reason


class MissingDependency(ConfigurationError):
    """An optional driver is not installed; the message names the pip extra."""

    def __init__(self, package: str, extra: str, detail: str = "") -> None:
        msg = f"{package} is not installed; install it with: pip install 'quickzones[{extra}]'"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)
        self.package = package
        self.extra = extra


class HandlerImportError(ConfigurationError):
    """A handler module named on the command line could not be imported."""

    def __init__(self, module: str, cause: BaseException) -> None:
        super().__init__(f"cannot import handler module {module!r}: {cause}")
        self.module = module


# --- bad input -----------------------------------------------------------------------


class InvalidArgument(QuickError, ValueError):
    """An argument to a public call is malformed or out of range."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"invalid {name} {shown}: {reason}")
        self.name = name
        self.reason = reason


class PayloadTooLarge(InvalidArgument):
    """A payload exceeds the configured maximum size."""

    def __init__(self, size: int, limit: int) -> None:
        QuickError.__init__(self, f"payload of {size} bytes exceeds the limit of {limit} bytes")
        self.name = "payload"
        self.reason = "too large"
        self.size = size
        self.limit = limit


class UnknownJobType(QuickError, LookupError):
    """No handler is registered for a job type."""

    def __init__(self, job_type: str) -> None:
        super().__init__(f"no handler registered for job type {job_type!r}")
        self.job_type = job_type


# --- zone operation outcomes ---------------------------------------------------------


class ItemNotFound(QuickError, LookupError):
    """The item does not exist (completed, cancelled, or never enqueued)."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"item {item_id!r} not found")
        self.item_id = item_id


class LeaseLost(QuickError):
    """The caller no longer holds the item's lease; ``reason`` says what happened (the
    lease expired and the item was leased again, the lease id does not match a live
    lease, the item was given back or is gone)."""

    def __init__(self, item_id: str, reason: str | None = None) -> None:
        self.reason = reason or "another holder took it"
        super().__init__(f"lease on item {item_id!r} is lost: {self.reason}")
        self.item_id = item_id


class ItemGone(ItemNotFound, LeaseLost):
    """A settle (complete, extend, nack, fail) of an item that is gone: completed,
    cancelled or dead-lettered meanwhile, or completed by this same caller whose first
    answer was lost. An :class:`ItemNotFound`, as an in-process store raises it; also a
    :class:`LeaseLost`, as the HTTP client raised it before (issue 41 point 15).
    ``reason`` says what became of it where the store knows."""

    def __init__(self, item_id: str, reason: str | None = None) -> None:
        self.reason = reason or "the item is gone"
        QuickError.__init__(self, f"item {item_id!r}: {self.reason}")
        self.item_id = item_id


class ItemNotVested(QuickError):
    """The item cannot be leased because it is not vested (leased or delayed)."""

    def __init__(self, item_id: str, vesting_ms: int) -> None:
        super().__init__(f"item {item_id!r} is not vested until {vesting_ms} ms")
        self.item_id = item_id
        self.vesting_ms = vesting_ms


class ItemAlreadyQueued(QuickError):
    """A dead letter cannot be requeued: its zone already holds an item with its id. Nothing
    changed; the dead letter is kept."""

    def __init__(self, zone: str, item_id: str) -> None:
        super().__init__(
            f"item {item_id!r} is already queued in {zone}; the dead letter was kept "
            "(cancel the queued item or purge the dead letter first)"
        )
        self.zone = zone
        self.item_id = item_id


class ZoneLeaseFailed(QuickError):
    """A consumer could not lease a pointer (someone else holds it or it moved)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"pointer lease failed: {reason}")
        self.reason = reason


# --- storage -------------------------------------------------------------------------


class StorageError(QuickError):
    """The store failed; ``retryable`` says whether running the transaction again may help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class HeldByOwnTransaction(StorageError):
    """A quick call would commit on its own while this thread's application transaction
    (an ``enqueue_on`` into it) holds the store's commit lock until it ends: it could
    only wait for its own thread. Raised at once; nothing was written. Commit or roll
    back the application's transaction first, or write through it (``enqueue_on``)."""

    def __init__(self, store: str) -> None:
        super().__init__(
            f"store {store}: this thread's application transaction holds quick's commit"
            " lock since its enqueue_on, so a commit of its own would wait for it: commit"
            " or roll back that transaction first, or enqueue through it with enqueue_on"
        )
        self.store = store


class CorruptRecord(StorageError):
    """A stored record cannot be decoded."""

    def __init__(self, key: bytes, reason: str) -> None:
        super().__init__(f"corrupt record at {key!r}: {reason}")
        self.key = key
        self.reason = reason


class KVError(StorageError):
    """A store error carrying FoundationDB's error code (``quickzones.store.kv`` names them)."""

    def __init__(self, code: int, detail: str = "", *, size: int | None = None) -> None:
        # The code tables belong to the KV seam, which imports this module.
        from quickzones.store.kv import ERROR_NAMES, MAYBE_COMMITTED, RETRYABLE

        self.code = code
        self.name = ERROR_NAMES.get(code, f"error_{code}")
        # For transaction_too_large: the transaction's size in bytes, when known.
        self.size = size
        msg = f"{self.name} ({code})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg, retryable=code in RETRYABLE)
        self.maybe_committed = code in MAYBE_COMMITTED


# FDB's codes for the failures below (api-error-codes.rst); quickzones.store.kv names them all.
_TRANSACTION_TOO_OLD = 1007
_TRANSACTION_TOO_LARGE = 2101


class TransactionTooLong(KVError):
    """A transaction's body outlived the store's transaction lifetime (FDB's 5 s) on two
    attempts in a row; it can never commit as written."""

    def __init__(self, elapsed_s: float, limit_s: float) -> None:
        super().__init__(
            _TRANSACTION_TOO_OLD,
            f"transaction ran for {elapsed_s:.1f} s, longer than the store's {limit_s:.0f} s"
            " transaction lifetime, so it can never commit; do less per transaction (split"
            " the work into smaller transactions, keep slow calls such as network I/O out"
            " of transactional handlers)",
        )
        self.retryable = False  # run() already retried; the same body fails the same way
        self.elapsed_s = elapsed_s
        self.limit_s = limit_s


class TransactionTooLarge(KVError):
    """A transaction's writes exceed the store's size limit (FDB's 10,000,000 bytes)."""

    def __init__(
        self, size: int | None, limit: int, what: str = "transaction", *, at_least: bool = False
    ) -> None:
        shown = "an unknown number of" if size is None else f"{size}"
        if at_least:
            shown = f"at least {shown}"
        super().__init__(
            _TRANSACTION_TOO_LARGE,
            f"{what} is too large: {shown} bytes of writes and conflict ranges exceed the"
            f" store's limit of {limit} bytes per transaction; split it into smaller"
            " transactions (nothing was written)",
            size=size,
        )
        self.limit = limit


class RetryLimitExceeded(KVError):
    """A transaction kept failing with retryable errors until its retry limit or its
    timeout ran out. ``code`` is the last error's (FDB re-raises that one); the last
    error itself is ``last_error``."""

    def __init__(
        self,
        attempts: int,
        elapsed_s: float,
        last_error: KVError,
        *,
        retry_limit: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        bound = (
            f"retry limit of {retry_limit}"
            if retry_limit is not None
            else f"timeout of {timeout_s:g} s"
        )
        super().__init__(
            last_error.code,
            f"transaction gave up after {attempts} attempts in {elapsed_s:.1f} s (its {bound}"
            f" ran out); last error: {last_error}; the store is overloaded or the"
            " transaction conflicts constantly: retry later, or raise retry_limit/timeout_ms"
            " in the store URL",
        )
        self.retryable = False  # run() already retried as long as it was allowed to
        self.maybe_committed = last_error.maybe_committed
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_error = last_error
        self.retry_limit = retry_limit
        self.timeout_s = timeout_s


class StoreFull(StorageError):
    """The store has no space left (disk full or a size cap); nothing was written."""

    def __init__(self, store: str, detail: str) -> None:
        super().__init__(
            f"store {store} is full ({detail}); free disk space or raise the size limit,"
            " then retry (this transaction wrote nothing)"
        )
        self.store = store
        self.detail = detail


class StoreLost(StorageError):
    """The store this process opened is no longer where it was opened (its file deleted,
    or replaced by another): nothing more is read or written through it. Restart the
    process to open the store there now."""

    def __init__(self, store: str, detail: str) -> None:
        super().__init__(
            f"store {store} is lost: {detail}; this process stops using it: restart it"
            " to open the store there now"
        )
        self.store = store
        self.detail = detail


class StoreBusy(StorageError):
    """Another connection held the store's write lock for longer than the busy timeout."""

    def __init__(self, store: str, busy_timeout_ms: int) -> None:
        super().__init__(
            f"store {store} is busy: another connection held its write lock for over"
            f" {busy_timeout_ms} ms; retry later, find the long transaction holding it,"
            " or raise busy_timeout_ms in the store URL",
            retryable=True,
        )
        self.store = store
        self.busy_timeout_ms = busy_timeout_ms


class StoreUnavailable(StorageError):
    """The store's server could not be reached: the connection was refused (nothing
    listens there: the server is down or restarting), timed out, or its host is unknown.
    Raised when a store is opened, and by a call once it has tried for as long as the
    store's ``timeout_ms`` allows (``down_s``: how long connections have failed). Nothing
    was written (no connection was made). Not retryable by the call that raised it;
    retry later, once the server is back."""

    def __init__(self, store: str, server: str, detail: str, down_s: float | None = None) -> None:
        tried = (
            ""
            if down_s is None
            else f" every connection has failed for {down_s:.1f} s, as long as the store's"
            " timeout_ms allows;"
        )
        super().__init__(
            f"store {store}: cannot connect to the PostgreSQL server at {server} ({detail}):"
            f" it is down, restarting or unreachable, not overloaded;{tried} nothing was"
            " written: start it (or fix the URL's host and port), then retry"
        )
        self.store = store
        self.server = server
        self.detail = detail
        self.down_s = down_s


class StoreMisconfigured(StorageError, ConfigurationError):
    """The store's server answered but refuses what the store URL names: a database or
    role that does not exist, a role without the privilege it needs on the database or
    the schema. ``reason`` says which. Not retryable: fix the URL or the grants."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(
            f"store {store}: {reason} (not retryable: fix the store URL or the grants)",
            retryable=False,
        )
        self.store = store
        self.reason = reason


class StoreNotFound(ConfigurationError):
    """A command that only reads was pointed at a store that does not exist."""

    def __init__(self, store: str) -> None:
        super().__init__(
            f"store {store} does not exist (check the path; commands that only read never"
            " create a store)"
        )
        self.store = store


class NotAQuickStore(ConfigurationError):
    """The file exists but is not a quick store; it was left untouched."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"{store} is not a quick store ({reason}); it was left untouched")
        self.store = store
        self.reason = reason


# --- handler outcomes ----------------------------------------------------------------


class HandlerError(QuickError):
    """Base for errors a handler raises to steer retries."""


class TransientError(HandlerError):
    """The handler failed in a way worth retrying (the default for unknown exceptions)."""


class PermanentError(HandlerError):
    """The handler failed in a way no retry will fix; the item goes to dead letters."""


class Nack(HandlerError):
    """Raised by a handler to hand the item back: it runs again after ``delay_s`` without
    counting an error, with ``meta`` merged into its metadata."""

    def __init__(self, delay_s: float = 0.0, meta: dict[str, object] | None = None) -> None:
        super().__init__(f"nack, retry in {delay_s}s")
        check_handler_meta(meta or {})
        self.delay_s = delay_s
        self.meta = dict(meta or {})


class UnsupportedByStore(ConfigurationError):
    """The zone store in use lacks a capability this call needs (checked before anything
    is written)."""

    def __init__(self, what: str, capability: str, store: str, hint: str = "") -> None:
        self.what = what
        self.capability = capability
        self.store = store
        message = f"{what}: not supported by {store} (it lacks the {capability!r} capability)"
        super().__init__(message + (f"; {hint}" if hint else ""))


class UnusableConnection(ConfigurationError):
    """The application's own connection cannot carry an enqueue (not an SQLite connection,
    closed, open on another file, or in autocommit with no transaction); nothing was
    written."""

    def __init__(self, connection: str, reason: str) -> None:
        super().__init__(f"cannot enqueue through {connection}: {reason}; nothing was written")
        self.connection = connection
        self.reason = reason


class OtherDatabase(UnusableConnection):
    """The application's connection reaches another database (or SQLite file) than the
    store's, so its transaction cannot carry the item; checked before anything is read
    or written, so the caller may enqueue another way (the Django backend then waits for
    the COMMIT)."""
