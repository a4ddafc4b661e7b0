"""One error tree for the whole library.

Every exception quick raises on purpose derives from :class:`QuickError`, carries its facts
as fields (never only in the message) and says in its name which failure it is.
"""

from __future__ import annotations


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
        msg = f"{package} is not installed; install it with: pip install 'quick-queue[{extra}]'"
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
    """The caller no longer holds the item's lease (another holder took it)."""

    def __init__(self, item_id: str) -> None:
        super().__init__(f"lease on item {item_id!r} is held by someone else")
        self.item_id = item_id


class ItemNotVested(QuickError):
    """The item cannot be leased because it is not vested (leased or delayed)."""

    def __init__(self, item_id: str, vesting_ms: int) -> None:
        super().__init__(f"item {item_id!r} is not vested until {vesting_ms} ms")
        self.item_id = item_id
        self.vesting_ms = vesting_ms


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


class CorruptRecord(StorageError):
    """A stored record cannot be decoded."""

    def __init__(self, key: bytes, reason: str) -> None:
        super().__init__(f"corrupt record at {key!r}: {reason}")
        self.key = key
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
        self.delay_s = delay_s
        self.meta = dict(meta or {})
