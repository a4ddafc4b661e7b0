"""Whether a consumer's store answers, said when it changes (issue 41 point 8).

The consumer's own store calls retry inside :func:`quickzones.store.kv.run` for up to a
minute before any of them fails, so a worker whose PostgreSQL server went away logged
nothing for the first 45 s of the outage, even with ``-v``. :class:`StoreWatch` reads one
small key of each cluster's store once a second, in one attempt with no retry, and
says:

- at once, one WARNING that the consumer lost its store, naming the error;
- while it stays away, one WARNING after 10 s, then 20 s, 40 s ... (at most every
  5 minutes), each with how long and how many reads failed: never a line per attempt;
- once a read works again, one INFO line that the store is back and after how long.

It only reads and logs: the scanner, the workers and the rest keep their own retries and
backoffs, and their work waits for the store, nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from quickzones.consumer.state import Cluster
from quickzones.errors import QuickError, StoreLost
from quickzones.store.kv import KVStore

log = logging.getLogger("quick.consumer")

CHECK_EVERY_S = 1.0
READ_TIMEOUT_MS = 5_000  # one read that hangs (a dropped network) counts as a failure
FIRST_REMINDER_S = 10.0
MAX_REMINDER_S = 300.0


@dataclass(slots=True)
class _Outage:
    started: float
    failures: int = 1
    next_reminder: float = 0.0
    gap_s: float = FIRST_REMINDER_S


class StoreWatch:
    """Reads each cluster's stored layout (one small key) every ``every_s`` and logs when
    its store stops or starts answering. ``monotonic`` is injected by tests."""

    def __init__(
        self,
        clusters: Mapping[str, Cluster],
        *,
        every_s: float = CHECK_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clusters = clusters
        self.every_s = every_s
        self.monotonic = monotonic
        self.outages: dict[str, _Outage] = {}  # by cluster, while its store is away

    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.every_s):
            self.check_once()

    def check_once(self) -> None:
        for cluster, c in self.clusters.items():
            try:
                _read(c.toplevel.kv, c.toplevel.keys.layout_key(cluster))
            except StoreLost:
                continue  # said at ERROR by the scanner, which ends the run
            except (QuickError, OSError) as err:
                self._failed(cluster, err)
            else:
                self._answered(cluster)

    def _failed(self, cluster: str, err: BaseException) -> None:
        now = self.monotonic()
        error = f"{type(err).__name__}: {err}"
        outage = self.outages.get(cluster)
        if outage is None:
            self.outages[cluster] = _Outage(now, next_reminder=now + FIRST_REMINDER_S)
            log.warning(
                "lost the store of cluster %r: %s; work waits until it answers again (said "
                "again after %g s, then less often, and when it is back)",
                cluster, error, FIRST_REMINDER_S,
            )  # fmt: skip
            return
        outage.failures += 1
        if now >= outage.next_reminder:
            outage.gap_s = min(MAX_REMINDER_S, outage.gap_s * 2)
            outage.next_reminder = now + outage.gap_s
            log.warning(
                "the store of cluster %r is still away after %.0f s (%d reads failed); "
                "the last: %s",
                cluster, now - outage.started, outage.failures, error,
            )  # fmt: skip

    def _answered(self, cluster: str) -> None:
        outage = self.outages.pop(cluster, None)
        if outage is not None:
            log.info(
                "the store of cluster %r is back after %.1f s (%d reads failed)",
                cluster, self.monotonic() - outage.started, outage.failures,
            )  # fmt: skip


def _read(kv: KVStore, key: bytes) -> None:
    """One read in one transaction, no retry; nothing is written or committed."""
    tr = kv.create_transaction()
    try:
        tr.set_timeout(READ_TIMEOUT_MS)
        tr.get(key, snapshot=True)
    finally:
        tr.reset()
