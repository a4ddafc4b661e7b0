"""A consumer's parameters, with the paper's names where it has one."""

from __future__ import annotations

from dataclasses import dataclass

from quick_core.errors import ConfigurationError


@dataclass(slots=True)
class ConsumerConfig:
    """Consumer parameters; names follow the paper where it has one."""

    peek_max: int = 100  # pointers peeked per shard visit
    selection_frac: float = 0.2  # share of peeked pointers a random scanner leases
    selection_max: int = 16  # at most this many per scan
    processing_bound: int = 256  # items in flight per consumer (local queue + running)
    dequeue_max: int = 10  # items one visit takes from one zone (water-filling)
    pointer_lease_s: float = 1.0  # p_duration
    min_inactive_s: float = 5.0  # empty zone's pointer lives this long before GC
    item_lease_s: float = 30.0
    lease_extend_s: float | None = None  # default: a third of the item lease
    managers: int = 4
    workers: int = 8
    idle_sleep_s: float = 0.02
    shutdown_deadline_s: float = 10.0
    election_ttl_s: float = 5.0
    in_order: bool | None = None  # None: take part in the election; True/False: force
    # Scan again whenever a manager is free (lower latency), or only once the last scan's
    # visits all finished (False: bigger batches per visit, a few % more throughput).
    pipelined_scans: bool = True
    seed: int | None = None

    def validate(self) -> None:
        if not 0 < self.selection_frac <= 1:
            raise ConfigurationError("selection_frac must be in (0, 1]")
        for name in ("peek_max", "selection_max", "processing_bound", "dequeue_max"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be at least 1")
        if self.managers < 1 or self.workers < 1:
            raise ConfigurationError("managers and workers must be at least 1")
        if self.pointer_lease_s <= 0 or self.item_lease_s <= 0:
            raise ConfigurationError("lease durations must be positive")
