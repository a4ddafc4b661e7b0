"""A steady enqueue on SQLite reads once: the snapshot's version comes with its first
read of a few keys, in one statement.

Part two's check reads the zone's pointer index entry and record once part one's writes
are in (``kv.read_after_commit``). On SQLite, when nothing committed since this store's
own last commit (its snapshot is of that commit's version and its commit took the write
lock inside it), those keys hold what that store last read or wrote: the values it kept
then answer, and the commit reads nothing after its writes (issue 44 point 1). Any other
commit in between (another process, another store object, the application's own
connection, this store's own write of those keys) makes the commit read them again, so a
pointer moved later in between is still pulled to the new item."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import KVTransaction, run
from quickzones.store.records import ZoneId
from tests.conftest import store_url

Z = ZoneId("app", "t1")
HOUR_MS = 3_600_000


def traced(q: Quick) -> list[str]:
    """Every statement the store's pooled connections run from now on."""
    statements: list[str] = []
    for conn in list(q.kv._pool):  # type: ignore[attr-defined]
        conn.set_trace_callback(statements.append)
    return statements


def reads_after_writes(statements: list[str]) -> list[str]:
    """The SELECTs a commit ran once it began writing (after its first write statement)."""
    writes = [i for i, s in enumerate(statements) if s.startswith(("INSERT", "UPDATE"))]
    return [s for s in statements[writes[0] :] if s.startswith("SELECT")] if writes else []


def move_pointer_later(q: Quick, clock: ManualClock) -> int:
    """Requeue ``Z``'s pointer an hour out in a transaction of ``q``'s store, as a
    consumer that did not see the zone's newest item would; returns its new vesting."""
    later = int(clock.now() * 1000) + HOUR_MS

    def move(tr: KVTransaction) -> None:
        pointer = q.toplevel.get_pointer(Z, tr=tr)
        assert pointer is not None
        shard = q.toplevel.shard_for(Z)
        q.toplevel._move_pointer(tr, shard, pointer, replace(pointer, vesting_ms=later))

    run(q.kv, move)
    return later


def pointer_vesting(q: Quick) -> int:
    pointer = q.toplevel.get_pointer(Z)
    assert pointer is not None
    return pointer.vesting_ms


def test_a_steady_enqueue_reads_nothing_once_its_writes_are_in(tmp_path: Path) -> None:
    q = Quick.open(store_url("sqlite", tmp_path))
    try:
        q.enqueue("job", {"n": 0}, app=Z.app, tenant=Z.tenant)  # makes the zone's pointer
        q.enqueue("job", {"n": 1}, app=Z.app, tenant=Z.tenant)  # reads it after its commit
        statements = traced(q)
        q.enqueue("job", {"n": 2}, app=Z.app, tenant=Z.tenant)
        assert reads_after_writes(statements) == [], statements
        assert [s for s in statements if s.startswith("BEGIN")] == ["BEGIN"], statements
        # One read, the snapshot's version with the layout and index entry: BEGIN, it,
        # the version written (the lock), the count's add, record and order entry, the
        # conflict row, COMMIT.
        assert len([s for s in statements if s.startswith("SELECT")]) == 1, statements
        assert len(statements) <= 8, statements
        assert q.zones.count(Z) == 3
    finally:
        q.close()


def test_a_pointer_another_process_moved_since_is_read_again_and_pulled(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    url = store_url("sqlite", tmp_path)
    q = Quick.open(url, clock=clock)
    other = Quick.open(url, clock=clock)  # its own connections: another process's view
    try:
        q.enqueue("job", {"n": 0}, app=Z.app, tenant=Z.tenant)
        q.enqueue("job", {"n": 1}, app=Z.app, tenant=Z.tenant)
        assert move_pointer_later(other, clock) > int(clock.now() * 1000)
        statements = traced(q)
        q.enqueue("job", {"n": 2}, app=Z.app, tenant=Z.tenant)
        assert reads_after_writes(statements) != [], statements
        assert pointer_vesting(q) <= int(clock.now() * 1000)
    finally:
        other.close()
        q.close()


def test_a_pointer_this_store_moved_since_is_read_again_and_pulled(tmp_path: Path) -> None:
    clock = ManualClock()
    q = Quick.open(store_url("sqlite", tmp_path), clock=clock)
    try:
        q.enqueue("job", {"n": 0}, app=Z.app, tenant=Z.tenant)
        q.enqueue("job", {"n": 1}, app=Z.app, tenant=Z.tenant)
        move_pointer_later(q, clock)  # this store's own commit wrote the pointer record
        q.enqueue("job", {"n": 2}, app=Z.app, tenant=Z.tenant)
        assert pointer_vesting(q) <= int(clock.now() * 1000)
    finally:
        q.close()


def test_a_pointer_moved_through_the_applications_connection_is_read_again(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    q = Quick.open(store_url("sqlite", tmp_path), clock=clock)
    conn = sqlite3.connect(str(tmp_path / "quick.db"))
    try:
        q.enqueue("job", {"n": 0}, app=Z.app, tenant=Z.tenant)
        q.enqueue("job", {"n": 1}, app=Z.app, tenant=Z.tenant)
        later = int(clock.now() * 1000) + HOUR_MS
        with q.kv.transaction_on(conn) as tr:  # type: ignore[attr-defined]
            pointer = q.toplevel.get_pointer(Z, tr=tr)
            assert pointer is not None
            shard = q.toplevel.shard_for(Z)
            q.toplevel._move_pointer(tr, shard, pointer, replace(pointer, vesting_ms=later))
        conn.commit()
        assert pointer_vesting(q) == later
        q.enqueue("job", {"n": 2}, app=Z.app, tenant=Z.tenant)
        assert pointer_vesting(q) <= int(clock.now() * 1000)
    finally:
        conn.close()
        q.close()


def test_enqueues_into_many_zones_in_turn_each_pull_a_pointer_moved_later(
    tmp_path: Path,
) -> None:
    """Values kept for several zones at once stay right while this store alone commits,
    and a zone whose pointer a consumer moved meanwhile is pulled back."""
    clock = ManualClock()
    q = Quick.open(store_url("sqlite", tmp_path), clock=clock)
    try:
        zones = [ZoneId("app", f"t{i}") for i in range(5)]
        for _ in range(3):
            for zone in zones:
                q.enqueue("job", b"x", app=zone.app, tenant=zone.tenant)
        move_pointer_later(q, clock)  # Z is zones[1]
        for zone in zones:
            q.enqueue("job", b"y", app=zone.app, tenant=zone.tenant)
        for zone in zones:
            pointer = q.toplevel.get_pointer(zone)
            assert pointer is not None and pointer.vesting_ms <= int(clock.now() * 1000)
            assert q.zones.count(zone) == 4
    finally:
        q.close()
