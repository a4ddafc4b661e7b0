"""The scan's peek beside a report's held snapshot (``zones=sql`` on PostgreSQL; issue 42
point 3): each enqueue's pull of an idle zone's pointer leaves the pointer's old version
where it vested before, up to the item lease (30 s) ahead, and PostgreSQL keeps every
such version while the snapshot is held. A peek that read on to the next pointers ahead
of now fetched each of them (2,813 buffers a scan, 100 scans a second, in the hold of
``python -m bench.pg_long_txn``): the consumer's peek now stops at its longest sleep."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.selection import longest_wait_ms
from quickzones.store.sql import SQLTopLevelQueue
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import beside_a_report, index_entries_read

ZONES = 40
ROUNDS = 10


def _pg_url() -> str:
    reason = postgres_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from tests.postgres import postgres_store_url

    return postgres_store_url() + "&zones=sql"


def _entries_read(
    conn: Any, toplevel: SQLTopLevelQueue, index: str, window: int, ahead_ms: int | None
) -> int:
    """The vesting index's entries (live or not) the statement the scan's peek runs now
    reads (:func:`tests.postgres.index_entries_read`)."""
    sql, args, _ = toplevel.peek_statement(0, window, ahead_ms=ahead_ms)
    args.pop("clock")
    return index_entries_read(conn, index, sql, args)


def test_a_scan_beside_a_held_snapshot_does_not_read_the_pointers_old_versions_ahead() -> None:
    """40 zones each hold an item due in 60 s, and 10 times (3 s apart, a report holding a
    REPEATABLE READ snapshot) get an item to run now: its enqueue pulls the zone's
    pointer from 60 s ahead, and the visits after it put the pointer back there. The
    consumer's peek then reads none of those 400 old versions; read on to the 17th pointer
    ahead (as before), it walks them all."""

    url = _pg_url()
    schema = url.split("schema=")[1].split("&")[0]
    clock = ManualClock()
    q = Quick.open(url, clock=clock)
    q.job("j")(lambda payload, ctx: None)
    config = ConsumerConfig(in_order=True)
    try:
        toplevel = q.toplevel
        assert isinstance(toplevel, SQLTopLevelQueue)
        with beside_a_report(url, schema) as conn:
            for z in range(ZONES):
                q.enqueue("j", {}, app="a", tenant=f"t{z}", delay=60)
            for _ in range(ROUNDS):
                for z in range(ZONES):
                    q.enqueue("j", {}, app="a", tenant=f"t{z}")
                assert q.run_until_idle(config) == ZONES
                clock.advance(3)  # past the look of the visits' reads: they look on
                assert q.run_until_idle(config) == 0
            window = config.peek_max
            index = f'"{schema}".quick_pointers_vesting'
            bounded = _entries_read(conn, toplevel, index, window, longest_wait_ms(config))
            unbounded = _entries_read(conn, toplevel, index, window, None)
            refs, later = toplevel.peek(0, window, ahead_ms=longest_wait_ms(config))
        print(f"vesting index entries read: to the longest sleep {bounded}, on {unbounded}")
        assert refs == [] and later is None  # every pointer vests 30 s on, past the look
        assert unbounded >= ZONES * ROUNDS, unbounded  # the old versions were there
        # Within the look: the last visits' pointer leases (1 s on), one a zone.
        assert bounded <= ZONES, bounded
    finally:
        q.close()
