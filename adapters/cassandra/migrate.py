"""Migration of Cassandra zones into KV zones (``quick migrate``).

Each zone is moved with :func:`quickzones.store.tenant_move.move_zone` (fence in Cassandra by a
conditional batch, copy in one KV transaction with per-item markers, delete the fenced
items by a conditional batch), so a crash at any point and a re-run lose nothing and copy
nothing twice. Zones run on a small thread pool; a run record and per-zone done markers in
the target's meta space make ``--resume`` skip finished zones.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgpack

from quickzones.adapters.cassandra.plans import Plan
from quickzones.adapters.cassandra.store import CassandraZoneStore
from quickzones.client import Quick
from quickzones.clock import Clock, SystemClock, now_ms
from quickzones.errors import ConfigurationError
from quickzones.store.kv import KVTransaction, run
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.tenant_move import (
    DEFAULT_FENCE_MS,
    MoveReport,
    fenced_copy,
    is_fence,
    move_zone,
    read_done,
)

log = logging.getLogger("quick.migrate")


class CassandraMoveSource:
    """Cassandra zones as the source of a move. ``pointers`` is the Cassandra deployment's
    pointer store, whose pointers are deleted once a zone is empty (None: leave them to
    the Cassandra consumers, which collect them after a strong read)."""

    def __init__(
        self, store: CassandraZoneStore, pointers: Quick | None, *, clock: Clock | None = None
    ) -> None:
        self.store = store
        self.pointers = pointers
        self.clock = clock or store.clock

    def list_items(self, zone: ZoneId) -> Iterator[WorkItem]:
        for item in self.store.items(zone):
            if isinstance(item, WorkItem):
                yield item
            else:
                log.warning("corrupt item %s in %s not migrated: %s", item.item_id, zone, item)

    def _batch(
        self, zone: ZoneId, plans: list[Plan], retry_one: Callable[[Plan], Plan | None]
    ) -> list[Plan]:
        """One conditional batch for the page; if refused or unknown, item by item."""
        if not plans:
            return []
        if self.store.table.cas([s for p in plans for s in p.statements]):
            return plans
        done = []
        for plan in plans:
            current = self.store.table.read_one(zone, plan.item.item_id, serial=True)
            if plan.applied(current):
                done.append(plan)
                continue
            again = retry_one(plan) if current is not None else None
            if again is not None:
                done.append(again)
        return done

    def fence(self, zone: ZoneId, items: Sequence[WorkItem], fence_id: str) -> list[WorkItem]:
        now = now_ms(self.clock)
        out: list[WorkItem] = []
        plans = []
        for item in items:
            if is_fence(item.lease_id):
                out.append(item)  # fenced by this or a crashed earlier run
            else:
                fenced = fenced_copy(item, fence_id, now, DEFAULT_FENCE_MS)
                plans.append(self.store._plan_update(zone, item, fenced))

        def one(plan: Plan) -> Plan | None:
            def decide(current: WorkItem | None) -> Plan | None:
                if current is None:
                    return None
                if (current.lease_id, current.vesting_ms) != (
                    plan.item.lease_id,
                    plan.item.vesting_ms,
                ):
                    return None  # changed since listed: the next pass reads it again
                return plan

            result = self.store._apply(zone, plan.item.item_id, decide)
            return plan if result is not None else None

        out.extend(p.result for p in self._batch(zone, plans, one) if p.result is not None)
        return out

    def delete_fenced(self, zone: ZoneId, items: Sequence[WorkItem]) -> None:
        plans = [self.store._plan_delete(zone, item) for item in items]

        def one(plan: Plan) -> Plan | None:
            def decide(current: WorkItem | None) -> Plan | None:
                if current is None or current.lease_id != plan.item.lease_id:
                    return None
                return self.store._plan_delete(zone, current)

            self.store._apply(zone, plan.item.item_id, decide)
            return plan

        self._batch(zone, plans, one)

    def drop_pointer_if_empty(self, zone: ZoneId) -> bool:
        if self.pointers is None:
            return False
        return self.pointers.toplevel.drop_pointer_if_empty(
            zone, lambda tr: self.store.zone_is_empty(tr, zone)
        )

    def count(self, zone: ZoneId) -> int:
        return self.store.count(zone)


@dataclass(slots=True)
class MigrationResult:
    run_id: str
    zones: int = 0
    skipped_done: int = 0
    moved: int = 0
    reports: list[MoveReport] = field(default_factory=list)

    @property
    def incomplete(self) -> list[MoveReport]:
        return [r for r in self.reports if not r.ok]


def _run_key(target: Quick, source: str) -> bytes:
    # (root, "m", "migrate", source) -> msgpack {run, started, finished}
    return target.keys.meta_key("migrate", source)


def _read_run(target: Quick, source: str) -> dict[str, Any] | None:
    raw = run(target.kv, lambda tr: tr.get(_run_key(target, source)))
    return None if raw is None else dict(msgpack.unpackb(raw, raw=False))


def _write_run(target: Quick, source: str, record: dict[str, Any]) -> None:
    def write(tr: KVTransaction) -> None:
        tr.set(_run_key(target, source), msgpack.packb(record, use_bin_type=True))

    run(target.kv, write)


def migrate(
    store: CassandraZoneStore,
    target: Quick,
    *,
    source_name: str,
    pointers: Quick | None = None,
    app: str | None = None,
    tenant: str | None = None,
    resume: bool = False,
    include_leased: bool = False,
    lease_wait_s: float = 60.0,
    workers: int = 8,
    page_size: int = 100,
    on_zone: Callable[[MoveReport], None] | None = None,
    on_moved: Callable[[int], None] | None = None,
    zones: list[ZoneId] | None = None,
) -> MigrationResult:
    """Move every (matching) Cassandra zone into ``target``; see the module docstring.

    Without ``resume``, an unfinished run recorded in the target is an error (so two runs
    are not confused); with it, zones that run finished are skipped.
    """
    previous = _read_run(target, source_name)
    if previous is not None and not previous.get("finished") and not resume:
        raise ConfigurationError(
            f"an unfinished migration from {source_name} (run {previous['run']}) is recorded "
            "in the target; pass --resume to continue it"
        )
    if resume and previous is not None and not previous.get("finished"):
        run_id = str(previous["run"])
    else:
        run_id = secrets.token_hex(8)
        _write_run(target, source_name, {"run": run_id, "started": time.time()})
    if zones is None:
        zones = [
            z
            for z in store.zones()
            if (app is None or z.app == app) and (tenant is None or z.tenant == tenant)
        ]
    result = MigrationResult(run_id)
    source = CassandraMoveSource(store, pointers, clock=SystemClock())

    def one(zone: ZoneId) -> MoveReport | None:
        if resume:
            done = read_done(target, zone)
            if done is not None and done.get("run") == run_id:
                return None
        return move_zone(
            source,
            target,
            zone,
            run_id=run_id,
            include_leased=include_leased,
            lease_wait_s=lease_wait_s,
            page_size=page_size,
            on_moved=on_moved,
        )

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="migrate") as pool:
        for zone, report in zip(zones, pool.map(one, zones), strict=True):
            result.zones += 1
            if report is None:
                result.skipped_done += 1
                if on_zone is not None:
                    on_zone(MoveReport(zone))
                continue
            result.reports.append(report)
            result.moved += report.moved
            if on_zone is not None:
                on_zone(report)
    if not result.incomplete and app is None and tenant is None:
        _write_run(target, source_name, {"run": run_id, "finished": time.time()})
    return result
