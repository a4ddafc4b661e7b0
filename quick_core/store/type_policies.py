"""Job-type policies in the store: what a type declares that must hold at enqueue.

A type's outcome records (``keep_status_s``, ``keep_result_s``, ``dedupe_s``), its
delivery and its ``ttl_s`` are copied into each item when it is enqueued, so they must be
known to every producer, not only to the processes that import the handler (a web
process, ``quick serve``). Registering a handler declares its type's policy, and the
process stores it here when a consumer starts and with its first enqueue that commits in
quick's own transaction (never in an application's):

    (root, "meta", "type_policy", job_type) -> JSON record

and a producer that has no handler for a type reads it, cached for :data:`CACHE_S`
seconds (a changed policy reaches producers within that time). A type no handler ever
registered has no record: its items get the defaults, as before.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from quickzones.errors import CorruptRecord, StorageError
from quickzones.store import outcomes
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.meta_sets import CACHE_MAX, Lru

# How long a producer trusts what it read of a type's policy (or that there is none).
CACHE_S = 5.0

AT_LEAST_ONCE = "at_least_once"


@dataclass(frozen=True, slots=True)
class TypePolicy:
    """What a job type declares that an enqueue copies into its items."""

    outcome: outcomes.Policy = field(default_factory=outcomes.Policy)
    delivery: str = AT_LEAST_ONCE
    ttl_ms: int | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "status_ms": self.outcome.status_ms,
                "result_ms": self.outcome.result_ms,
                "dedupe_ms": self.outcome.dedupe_ms,
                "delivery": self.delivery,
                "ttl_ms": self.ttl_ms,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, key: bytes, raw: bytes) -> TypePolicy:
        try:
            d = json.loads(raw)
            ttl = d.get("ttl_ms")
            return cls(
                outcomes.Policy(int(d["status_ms"]), int(d["result_ms"]), int(d["dedupe_ms"])),
                str(d["delivery"]),
                None if ttl is None else int(ttl),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptRecord(key, f"job type policy: {err}") from err

log = logging.getLogger("quick.type_policies")


class TypePolicies:
    """The store's job-type policies, written by registrations and read by producers."""

    def __init__(
        self,
        kv: KVStore,
        keys: KeySpace,
        *,
        cache_s: float = CACHE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kv = kv
        self.keys = keys
        self.cache_s = cache_s
        self._monotonic = monotonic
        # Per job type, bounded: a producer of many types keeps the recently used ones.
        self._cache: Lru[str, tuple[float, TypePolicy | None]] = Lru(CACHE_MAX)
        # Declared but not stored yet: the store refused the write (full, unreachable).
        self._pending: dict[str, TypePolicy] = {}
        self._warned: set[str] = set()  # pending types whose refused write was logged

    def key(self, job_type: str) -> bytes:
        return self.keys.meta_key("type_policy", job_type)

    def declare(self, job_type: str, policy: TypePolicy) -> None:
        """The type's policy, as its registration says (the last one wins): known to this
        process at once, stored by :meth:`store_pending`. A registration writes nothing:
        it may come inside an application's open transaction (the Django backend registers
        a task at its first enqueue), where a write of quick's own would wait for the
        application's lock on a shared SQLite file."""
        self._cache.put(job_type, (self._monotonic(), policy))
        self._pending[job_type] = policy

    def store_pending(self) -> None:
        """Store the declared policies not stored yet, each in a transaction of its own
        that writes only when the stored one differs (so every worker's start costs one
        read a type). Called when a consumer starts and before an enqueue that commits in
        quick's own transaction; a no-op once nothing is pending. A store that refuses
        the write (full, unreachable) does not stop the caller (a worker must still start
        and drain a full store): the policy stays pending, said once at WARNING."""
        for job_type, policy in list(self._pending.items()):
            key = self.key(job_type)
            value = policy.encode()

            def write(tr: KVTransaction, key: bytes = key, value: bytes = value) -> None:
                if tr.get(key) != value:
                    tr.set(key, value)

            try:
                run(self.kv, write)
            except StorageError as err:
                if job_type not in self._warned:
                    self._warned.add(job_type)
                    log.warning(
                        "job type %s: its policy (status, result, dedupe) is not stored yet"
                        " (%s); producers that do not register its handler use none until"
                        " it is",
                        job_type,
                        err,
                    )
                continue
            self._pending.pop(job_type, None)
            self._warned.discard(job_type)

    def get(self, job_type: str) -> TypePolicy | None:
        """The type's stored policy (None: no handler of it ever registered)."""
        now = self._monotonic()
        cached = self._cache.get(job_type)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        key = self.key(job_type)

        def read(tr: KVTransaction) -> TypePolicy | None:
            raw = tr.get(key, snapshot=True)
            return None if raw is None else TypePolicy.decode(key, raw)

        policy = run(self.kv, read)
        self._cache.put(job_type, (now, policy))
        return policy
