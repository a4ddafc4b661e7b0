"""Part two of an ``enqueue_on`` follows the application's COMMIT (issue 42), whatever
else is open: a transaction the application left open, or one that undid quick's
writes with a savepoint of its own, holds up no other's part two, and a rolled-back
one runs none."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.store.records import ZoneId
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)
psycopg = pytest.importorskip("psycopg")

ZONE = ZoneId("shop", "t1")


@pytest.fixture()
def url() -> str:
    return postgres_store_url()


@pytest.fixture()
def q(url: str) -> Iterator[Quick]:
    quick = Quick.open(url)

    @quick.job("ship")
    def ship(payload: object, ctx: object) -> None:
        return None

    yield quick
    quick.close()


def _server(url: str) -> str:
    return url.split("?")[0]


def _idle_zone(q: Quick) -> int:
    """A zone whose pointer vests in an hour; its vesting time."""
    q.enqueue("ship", {"late": True}, app=ZONE.app, tenant=ZONE.tenant, delay=3600)
    pointer = q.toplevel.get_pointer(ZONE)
    assert pointer is not None
    return pointer.vesting_ms


def _pulled(q: Quick, before_ms: int) -> bool:
    pointer = q.toplevel.get_pointer(ZONE)
    return pointer is not None and pointer.vesting_ms < before_ms


def test_part_two_follows_a_commit_after_the_application_undid_quicks_savepoint(
    q: Quick, url: str
) -> None:
    """The application rolls back to a savepoint of its own taken before the enqueue:
    quick's locks go with it, its transaction stays open; the item is gone, and so is
    part two's reason, but what it registered must neither spin nor block the others."""
    late = _idle_zone(q)
    with psycopg.connect(_server(url)) as conn, conn.transaction():
        with pytest.raises(RuntimeError), conn.transaction():  # the app's savepoint
            q.enqueue_on(conn, "ship", {"undone": True}, app=ZONE.app, tenant=ZONE.tenant)
            raise RuntimeError("undo")
        time.sleep(0.3)
        # Then another transaction enqueues and commits: its part two is not held up.
        with psycopg.connect(_server(url)) as other, other.transaction():
            q.enqueue_on(other, "ship", {"now": True}, app=ZONE.app, tenant=ZONE.tenant)
        assert wait_for(lambda: _pulled(q, late), 10)
    assert wait_for(lambda: q.kv.after_commit.pending == 0, 10)  # type: ignore[attr-defined]
    assert q.run_until_idle() == 1  # the one committed item; the undone one never was


def test_a_rolled_back_transaction_runs_nothing_and_leaves_the_line(q: Quick, url: str) -> None:
    late = _idle_zone(q)
    with psycopg.connect(_server(url)) as conn:
        q.enqueue_on(conn, "ship", {"no": True}, app=ZONE.app, tenant=ZONE.tenant)
        time.sleep(0.1)
        conn.rollback()
    assert wait_for(lambda: q.kv.after_commit.pending == 0, 10)  # type: ignore[attr-defined]
    assert not _pulled(q, late)
    assert q.run_until_idle() == 0


def test_an_open_transaction_holds_up_no_other_transactions_part_two(q: Quick, url: str) -> None:
    """The store's thread waits for the first transaction in line; one left open (a slow
    request) must not keep a later one's part two waiting until it ends."""
    late = _idle_zone(q)
    other = ZoneId("shop", "t2")
    q.enqueue("ship", {"late": True}, app=other.app, tenant=other.tenant, delay=3600)
    with psycopg.connect(_server(url)) as slow, slow.transaction():
        q.enqueue_on(slow, "ship", {"slow": True}, app=other.app, tenant=other.tenant)
        time.sleep(0.1)  # first in line
        with psycopg.connect(_server(url)) as quick_one, quick_one.transaction():
            q.enqueue_on(quick_one, "ship", {"now": True}, app=ZONE.app, tenant=ZONE.tenant)
        assert wait_for(lambda: _pulled(q, late), 10)  # while the slow one is still open
    assert wait_for(lambda: q.kv.after_commit.pending == 0, 10)  # type: ignore[attr-defined]


def test_a_transaction_held_open_is_asked_after_less_often_as_it_ages(q: Quick, url: str) -> None:
    """A user's complaint: a request that enqueued and then waited two seconds on a slow
    API had its process ask the server for its transaction's status every 3 ms the whole
    time (about 600 queries, 7-9 % of a core). A transaction is asked after at a pace
    that follows its age (a tenth of it, from 3 ms to 50 ms), so one held long costs a
    few dozen queries, and its part two still follows its COMMIT."""
    late = _idle_zone(q)
    after = q.kv.after_commit  # type: ignore[attr-defined]
    with psycopg.connect(_server(url)) as conn:
        q.enqueue_on(conn, "ship", {"slow": True}, app=ZONE.app, tenant=ZONE.tenant)
        asked = after.asks
        time.sleep(2.0)  # the slow API
        held = after.asks - asked
        assert not _pulled(q, late)
        conn.commit()
    assert wait_for(lambda: _pulled(q, late), 10)
    assert 5 <= held <= 100, held


def test_close_runs_part_two_of_every_transaction_committed_before_it(url: str) -> None:
    """A web process that shuts down right after its last requests committed: their
    items must not wait for their zones' pointers to vest on their own (seen: at 780
    transactions a second, 14 % of the items waited 25-30 s, the item lease, as close
    dropped the part twos still in line)."""
    zones = [ZoneId("shop", f"c{i}") for i in range(20)]
    producer = Quick.open(url)
    late = {}
    for zone in zones:
        producer.enqueue("ship", {"late": True}, app=zone.app, tenant=zone.tenant, delay=3600)
        pointer = producer.toplevel.get_pointer(zone)
        assert pointer is not None
        late[zone] = pointer.vesting_ms
    for zone in zones:
        with psycopg.connect(_server(url)) as conn, conn.transaction():
            producer.enqueue_on(conn, "ship", {"now": True}, app=zone.app, tenant=zone.tenant)
    producer.close()  # right after the last COMMIT
    reader = Quick.open(url)
    try:
        for zone in zones:
            pointer = reader.toplevel.get_pointer(zone)
            assert pointer is not None and pointer.vesting_ms < late[zone], zone
    finally:
        reader.close()


def test_one_transaction_enqueueing_into_many_idle_zones_pulls_every_pointer(
    q: Quick, url: str
) -> None:
    """A nightly job's transaction enqueues one item for each of 600 tenants whose zones
    sat idle: part two's reads of all their pointers (more keys than one statement of a
    round reads) must pull every one, not only the first statement's."""
    zones = [ZoneId("shop", f"m{i}") for i in range(600)]
    late = {}
    for zone in zones:
        q.enqueue("ship", {"late": True}, app=zone.app, tenant=zone.tenant, delay=3600)
    for zone in zones:
        pointer = q.toplevel.get_pointer(zone)
        assert pointer is not None
        late[zone] = pointer.vesting_ms
    with psycopg.connect(_server(url)) as conn, conn.transaction():
        for zone in zones:
            q.enqueue_on(conn, "ship", {"now": True}, app=zone.app, tenant=zone.tenant)
    assert wait_for(lambda: q.kv.after_commit.pending == 0, 20)  # type: ignore[attr-defined]

    def all_pulled() -> bool:
        return all(
            (p := q.toplevel.get_pointer(zone)) is not None and p.vesting_ms < late[zone]
            for zone in zones
        )

    assert wait_for(all_pulled, 20)


EXITING_APP = """
import sys, psycopg
from quickzones.client import Quick

url, server, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = Quick.open(url)
for i in range(n):
    with psycopg.connect(server) as conn, conn.transaction():
        q.enqueue_on(conn, "ship", {"now": True}, app="shop", tenant=f"x{i}")
# The process ends here, as a web worker does when it is recycled: no close().
"""


def test_a_process_that_exits_without_close_runs_its_committed_part_twos(
    url: str, tmp_path: Any
) -> None:
    """A web process recycled right after its last requests committed never calls
    close(): their part twos must still run before the interpreter ends, or the items
    wait for their zones' pointers to vest on their own (the item lease, 30 s)."""
    zones = [ZoneId("shop", f"x{i}") for i in range(10)]
    late = {}
    q = Quick.open(url)
    try:
        for zone in zones:
            q.enqueue("ship", {"late": True}, app=zone.app, tenant=zone.tenant, delay=3600)
            pointer = q.toplevel.get_pointer(zone)
            assert pointer is not None
            late[zone] = pointer.vesting_ms
        script = tmp_path / "app.py"
        script.write_text(EXITING_APP)
        done = subprocess.run(
            [sys.executable, str(script), url, _server(url), str(len(zones))],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        for zone in zones:
            pointer = q.toplevel.get_pointer(zone)
            assert pointer is not None and pointer.vesting_ms < late[zone], zone
    finally:
        q.close()
