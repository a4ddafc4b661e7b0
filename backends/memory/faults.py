"""Fault injection settings for the simulator and the URL options that set them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from quickzones.errors import InvalidArgument, InvalidStoreURL
from quickzones.urls import RETRY_OPTIONS, parse_retry_option

# Keys of MemoryStore.fault_counts, one per kind of injected fault.
FAULT_KINDS = (
    "not_committed",
    "unknown_result_applied",
    "unknown_result_not_applied",
    "too_old",
    "latency",
)


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Per-commit probabilities of injected faults (commits with writes only).

    ``unknown_result`` raises ``commit_unknown_result`` (1021); ``unknown_result_applied``
    is the chance that such a commit was applied anyway. ``latency_ms`` is slept through
    the store's clock before every commit, so a ManualClock just moves forward.
    """

    not_committed: float = 0.0
    unknown_result: float = 0.0
    unknown_result_applied: float = 0.5
    too_old: float = 0.0
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("not_committed", "unknown_result", "unknown_result_applied", "too_old"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise InvalidArgument(name, value, "must be a probability in [0, 1]")
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise InvalidArgument("latency_ms", self.latency_ms, "must be >= 0")


# URL query option -> FaultConfig field.
_URL_FAULTS = {
    "fault_not_committed": "not_committed",
    "fault_unknown_result": "unknown_result",
    "fault_unknown_result_applied": "unknown_result_applied",
    "fault_too_old": "too_old",
    "latency_ms": "latency_ms",
}


@dataclass(frozen=True, slots=True)
class MemoryURL:
    """A parsed ``memory://[name]?seed=..&fault_...=..`` URL."""

    name: str
    seed: int
    faults: FaultConfig
    # Bounds of run()'s retry loop on this store (None: quickzones.store.kv's defaults).
    retry_limit: int | None = None
    timeout_ms: int | None = None


def parse_memory_url(url: str) -> MemoryURL:
    try:
        parts = urlsplit(url)
    except ValueError as err:
        raise InvalidStoreURL(url, str(err)) from err
    if parts.scheme.lower() != "memory":
        raise InvalidStoreURL(url, "expected the memory:// scheme")
    if parts.path not in ("", "/"):
        raise InvalidStoreURL(url, "a memory URL has no path; name a shared store as memory://name")
    seed = 0
    fault_args: dict[str, float] = {}
    bounds: dict[str, int] = {}
    for option, raw in parse_qsl(parts.query, keep_blank_values=True):
        if option in RETRY_OPTIONS:
            bounds[option] = parse_retry_option(url, option, raw)
            continue
        try:
            if option == "seed":
                seed = int(raw)
            elif option in _URL_FAULTS:
                fault_args[_URL_FAULTS[option]] = float(raw)
            else:
                known = ", ".join(["seed", *_URL_FAULTS, *RETRY_OPTIONS])
                raise InvalidStoreURL(url, f"unknown option {option!r}; known: {known}")
        except ValueError as err:
            raise InvalidStoreURL(url, f"option {option}={raw!r} is not a number") from err
    try:
        faults = FaultConfig(**fault_args)
    except InvalidArgument as err:
        raise InvalidStoreURL(url, str(err)) from err
    return MemoryURL(parts.netloc, seed, faults, **bounds)
