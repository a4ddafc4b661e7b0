"""quickzones: QuiCK (SIGMOD '21) queue zones in your own transactional store.

The names a user needs are importable from here::

    from quickzones import Quick, ConsumerConfig, RetryPolicy, PermanentError

Everything else lives in the submodules named in ``docs/architecture.md``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from quickzones.batches import Batch, Chain, Job
from quickzones.client import Quick
from quickzones.clock import Clock, ManualClock, SystemClock
from quickzones.consumer.config import ConsumerConfig
from quickzones.errors import (
    ConfigurationError,
    CorruptRecord,
    HandlerImportError,
    InvalidArgument,
    InvalidStoreURL,
    ItemNotFound,
    ItemNotVested,
    LeaseLost,
    MissingDependency,
    Nack,
    PayloadTooLarge,
    PermanentError,
    QuickError,
    StorageError,
    TransientError,
    UnknownJobType,
    UnsupportedByStore,
    ZoneLeaseFailed,
)
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.flow_keys import Debounce
from quickzones.store.records import Pointer, WorkItem, ZoneId

if TYPE_CHECKING:
    from quickzones.aio import AsyncQuick

try:
    __version__ = version("quickzones")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "AsyncQuick",
    "Batch",
    "Chain",
    "Clock",
    "ConfigurationError",
    "ConsumerConfig",
    "CorruptRecord",
    "Debounce",
    "HandlerImportError",
    "InvalidArgument",
    "InvalidStoreURL",
    "ItemNotFound",
    "ItemNotVested",
    "Job",
    "JobContext",
    "LeaseLost",
    "ManualClock",
    "MissingDependency",
    "Nack",
    "PayloadTooLarge",
    "PermanentError",
    "Pointer",
    "Quick",
    "QuickError",
    "RetryPolicy",
    "StorageError",
    "SystemClock",
    "TransientError",
    "UnknownJobType",
    "UnsupportedByStore",
    "WorkItem",
    "ZoneId",
    "ZoneLeaseFailed",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # AsyncQuick on first use: it imports asyncio, which a worker or a producer that
    # never uses it would load at every start (about a tenth of quick worker's imports).
    if name == "AsyncQuick":
        from quickzones.aio import AsyncQuick

        return AsyncQuick
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
