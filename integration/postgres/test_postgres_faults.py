"""Hidden faults on a real PostgreSQL (issue 30 point 4): consumer processes SIGKILLed and
SIGSTOPped under load, the server stopped as ``pg_ctl -m immediate`` does (SIGQUIT: no
shutdown checkpoint, WAL replay at restart) and restarted mid-run, and every client
connection dropped (``pg_terminate_backend``). At the end no at-least-once item is lost
and every transactional handler's write committed exactly once."""

from __future__ import annotations

import random
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.faults.fleet import ConsumerFleet
from quickzones.client import Quick
from quickzones.store.kv import KVTransaction, run, unpack_i64
from quickzones.testing.provision.postgres import LocalPostgres, find_pg_bin, postgres_required

CONSUMER = textwrap.dedent(
    """
    import os, sys
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig

    url, log_path = sys.argv[1], sys.argv[2]
    q = Quick.open(url)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    @q.job("alo")
    def alo(payload, ctx):
        os.write(fd, (ctx.item_id + "\\n").encode())

    if "zones=sql" not in url:  # the native zones run no transactional handler yet

        @q.job("tx", transactional=True)
        def tx(payload, ctx):
            # Committed with the item's completion, or not at all.
            ctx.tr.add(b"ran/" + ctx.item_id.encode(), (1).to_bytes(8, "little"))

    config = ConsumerConfig(
        item_lease_s=1.0, pointer_lease_s=0.5, idle_sleep_s=0.01, min_inactive_s=1.0,
        workers=4, managers=2,
    )
    q.consumer(config).run_forever()
    """
)


@pytest.fixture
def server() -> Iterator[LocalPostgres]:
    if find_pg_bin() is None:
        if postgres_required():
            pytest.fail("QUICK_REQUIRE_POSTGRES is set but there is no initdb", pytrace=False)
        pytest.skip("no PostgreSQL (initdb) here")
    pg = LocalPostgres().start()  # its own cluster: this test stops and restarts it
    yield pg
    pg.close()


def _drop_connections(server: LocalPostgres) -> None:
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )


@pytest.mark.parametrize("zones", ["kv", "sql"])
def test_workers_killed_paused_and_server_restarted(
    tmp_path: Path, server: LocalPostgres, zones: str
) -> None:
    """In both zone layouts (``zones=sql``: at-least-once items only, the native zones
    run no transactional handler yet)."""
    rng = random.Random(30)
    url = f"{server.url}?schema=faults" + ("&zones=sql" if zones == "sql" else "")
    transactional = zones == "kv"
    producer = Quick.open(url)
    alo: set[str] = set()
    tx: set[str] = set()
    faults: Counter[str] = Counter()
    fleet = ConsumerFleet(tmp_path, CONSUMER, url, 3)
    try:
        # One fault a second, in this order, while the producer keeps enqueueing.
        schedule = ["sigkill", "sigstop", "restart", "drop", "sigkill", "sigstop", "restart",
                    "drop", "sigkill", "sigstop"]  # fmt: skip
        next_fault = time.time() + 1
        while schedule:
            for _ in range(rng.randint(3, 8)):
                tenant = f"t{rng.randint(0, 9)}"
                alo.add(producer.enqueue("alo", b"", app="app", tenant=tenant))
                if rng.random() < 0.3 and transactional:
                    tx.add(producer.enqueue("tx", b"", app="app", tenant=tenant))
            if time.time() < next_fault:
                time.sleep(0.05)
                continue
            next_fault = time.time() + 1
            fault, slot = schedule.pop(0), rng.randrange(3)
            if fault == "restart":
                server.stop_immediate()  # pg_ctl -m immediate: no checkpoint, WAL replay
                time.sleep(rng.uniform(0.2, 1.0))
                server.start()
            elif fault == "sigkill":
                fleet.kill(slot)
            elif fault == "sigstop":
                fleet.pause(slot, rng.uniform(1.2, 2.0))  # past its item leases
            else:
                _drop_connections(server)
            faults[fault] += 1
        deadline = time.time() + 90
        while time.time() < deadline:
            if alo <= set(fleet.ran()) and tx <= set(_tx_counts(producer)):
                break
            time.sleep(0.5)
    finally:
        fleet.stop()
    ran = fleet.ran()
    counts = _tx_counts(producer)
    producer.close()
    lost = alo - set(ran)
    tx_lost = tx - set(counts)
    tx_twice = {i: n for i, n in counts.items() if n != 1}
    print(
        f"faults injected: {dict(faults)}; items {len(alo)} at-least-once, {len(tx)}"
        f" transactional; lost {len(lost)} + {len(tx_lost)}; transactional twice {len(tx_twice)}"
    )
    assert not lost, f"{len(lost)} at-least-once items never ran"
    assert not tx_lost, f"{len(tx_lost)} transactional items never committed"
    assert not tx_twice, f"transactional handlers committed more than once: {tx_twice}"
    assert faults == {"sigkill": 3, "sigstop": 3, "restart": 2, "drop": 2}


def _tx_counts(q: Quick) -> dict[str, int]:
    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        return tr.get_range(b"ran/", b"ran0", snapshot=True)

    return {k[4:].decode(): unpack_i64(v) for k, v in run(q.kv, read)}
