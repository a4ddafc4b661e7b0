"""Helpers for testing code that uses quick: drain a queue deterministically
(:func:`run_until_idle`), and get a throwaway Redis, memcached, Cassandra or FoundationDB
for election and store tests.

The pytest plugin (:mod:`quickzones.testing.pytest_plugin`) wraps these in fixtures; they are plain
functions and context managers so other test runners can use them too.

The servers come from :mod:`quickzones.testing.provision` (re-exported here): each ``provide_*``
context manager tries, in order, a container (Docker), the server an environment variable
names, a local server binary started on a free port, a server already listening on the
default local port; and raises :class:`ServiceUnavailable` naming what it tried when none
works. FoundationDB puts Docker after the cluster file and the local binaries
(``FDB_BIN_DIR``, ``../shared/fdb``, ``PATH``): see :func:`provide_fdb_cluster_file`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickzones.clock import ManualClock
from quickzones.consumer.config import ConsumerConfig
from quickzones.store.steady_clock import SteadyClock
from quickzones.testing.provision import (
    CassandraEndpoint,
    ServiceUnavailable,
    provide_cassandra,
    provide_fdb_cluster_file,
    provide_memcached,
    provide_redis,
)

if TYPE_CHECKING:
    from quickzones.client import Quick


# --- draining --------------------------------------------------------------------------


def run_until_idle(
    quick: Quick,
    *,
    advance_clock: bool = False,
    max_advance_s: float = 86_400.0,
    config: ConsumerConfig | None = None,
) -> int:
    """Run every vested item in this thread, with an in-order scanner and a fixed seed, so
    the same test always runs items in the same order; returns how many ran.

    With ``advance_clock`` (the Quick must use a :class:`ManualClock`) it then moves the
    clock to the next vesting time (delayed items, retry backoffs, nacks) and drains again,
    until no item is left or the next one vests more than ``max_advance_s`` from the start.
    """
    cfg = config or ConsumerConfig(in_order=True, seed=0)
    done = quick.run_until_idle(cfg)
    if not advance_clock:
        return done
    clock = quick.clock
    # A steady clock over a ManualClock: let time pass on the manual clock beneath it.
    manual = clock.base if isinstance(clock, SteadyClock) else clock
    if not isinstance(manual, ManualClock):
        raise TypeError("advance_clock needs a Quick opened with a ManualClock")
    limit_ms = int((clock.now() + max_advance_s) * 1000)
    ran = done
    for _ in range(10_000):
        nxt = next_vesting_ms(quick)
        if nxt is None or nxt > limit_ms:
            break
        if nxt > clock.now() * 1000:
            manual.advance(nxt / 1000 + 0.001 - clock.now())
        elif ran == 0:
            break  # vested, yet the last round ran nothing (held by a lease elsewhere)
        ran = quick.run_until_idle(cfg)
        done += ran
    return done


def next_vesting_ms(quick: Quick) -> int | None:
    """The earliest vesting time of any item in any active zone, or None."""
    from quickzones.store.admin import active_zones

    times = [quick.items.min_vesting_ms(z.zone) for z in active_zones(quick)]
    found = [t for t in times if t is not None]
    return min(found) if found else None


__all__ = [
    "CassandraEndpoint",
    "ServiceUnavailable",
    "next_vesting_ms",
    "provide_cassandra",
    "provide_fdb_cluster_file",
    "provide_memcached",
    "provide_redis",
    "run_until_idle",
]
