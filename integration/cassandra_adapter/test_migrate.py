"""``quick migrate`` from Cassandra zones into a KV store, killed with SIGKILL halfway and
resumed: every item ends in the target exactly once and none is left in Cassandra.

Size: QUICK_MIGRATE_ITEMS items over QUICK_MIGRATE_TENANTS tenants (default 10,000 over
1,000, the full-size run; see docs/cassandra.md for timings).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from integration.cassandra_adapter.helpers import cassandra_url, wait_for
from integration.cassandra_local import LocalCassandra, cassandra_driver
from quickzones.adapters.cassandra.schema import ITEM_COLUMNS
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.store.kv import run

pytest_plugins = ["integration.cassandra_fixtures"]
pytestmark = pytest.mark.cassandra

ITEMS = int(os.environ.get("QUICK_MIGRATE_ITEMS", "10000"))
TENANTS = int(os.environ.get("QUICK_MIGRATE_TENANTS", "1000"))


def _seed(session: Any, keyspace: str, items: int, tenants: int) -> dict[tuple[str, str], set[str]]:
    """Write items straight into the zone table (plain writes: seeding 10k items through
    the enqueue's LWT and pointer transaction would only slow the test down)."""
    execute_concurrent_with_args = cassandra_driver().concurrent.execute_concurrent_with_args

    cols = ", ".join(ITEM_COLUMNS)
    marks = ", ".join("?" for _ in ITEM_COLUMNS)
    ins_item = session.prepare(
        f"INSERT INTO {keyspace}.zone_rows (app, tenant, kind, o_priority, o_vesting, item_id, "
        f"{cols}) VALUES (?, ?, 1, 0, 0, ?, {marks})"
    )
    ins_order = session.prepare(
        f"INSERT INTO {keyspace}.zone_rows (app, tenant, kind, o_priority, o_vesting, item_id) "
        "VALUES (?, ?, 0, ?, ?, ?)"
    )
    now = int(time.time() * 1000)
    expected: dict[tuple[str, str], set[str]] = defaultdict(set)
    item_args, order_args = [], []
    for n in range(items):
        app, tenant = f"app{n % tenants % 3}", f"tenant{n % tenants:05d}"
        item_id = f"item{n:06d}"
        priority, vesting = n % 4, now - 1000 + (n % 50) * 10
        expected[(app, tenant)].add(item_id)
        fields = ("job", f"payload {n}".encode(), priority, vesting, now - 5000, n % 3, "")
        fields += (None, "bytes", None, "at_least_once", n % 2, None)
        item_args.append((app, tenant, item_id, *fields))
        order_args.append((app, tenant, priority, vesting, item_id))
    for stmt, args in ((ins_item, item_args), (ins_order, order_args)):
        results = execute_concurrent_with_args(session, stmt, args, concurrency=64)
        assert all(ok for ok, _ in results)
    return expected


def _target_items(q: Quick) -> dict[tuple[str, str], list[str]]:
    begin, end = q.keys.all_zones_range()
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    cursor = begin
    while True:
        rows = run(q.kv, lambda tr, c=cursor: tr.get_range(c, end, limit=5000, snapshot=True))
        for key, _ in rows:
            parts = q.keys.unpack(key)
            if len(parts) == 5 and parts[3] == "i":
                found[(str(parts[1]), str(parts[2]))].append(str(parts[4]))
        if len(rows) < 5000:
            return found
        cursor = rows[-1][0] + b"\x00"


def _done_zones(q: Quick) -> int:
    begin, end = q.keys.meta_range("move")
    rows = run(q.kv, lambda tr: tr.get_range(begin, end, snapshot=True))
    return sum(1 for k, _ in rows if q.keys.unpack(k)[-1] == "done")


def test_migration_killed_halfway_and_resumed(
    cassandra_node: LocalCassandra,
    cassandra_session: Any,
    cassandra_keyspace: str,
    tmp_path: Path,
) -> None:
    url = cassandra_url(cassandra_node, cassandra_session, cassandra_keyspace)
    expected = _seed(cassandra_session, cassandra_keyspace, ITEMS, TENANTS)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    zones = len(expected)

    dry = CliRunner().invoke(main, ["migrate", "--from", url, "--to", target, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"{zones} zones, {ITEMS} items would move" in dry.output

    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "quickzones.cli", "migrate", "--from", url, "--to", target]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    q = Quick.open(target)
    try:
        wait_for(lambda: _done_zones(q) >= zones // 2, 600, "half the zones", step=0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    at_kill = sum(len(v) for v in _target_items(q).values())
    assert 0 < at_kill < ITEMS

    # Without --resume an unfinished run is refused; with it, the run completes.
    refused = CliRunner().invoke(main, ["migrate", "--from", url, "--to", target])
    assert refused.exit_code == 2 and "--resume" in refused.output
    resumed = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, timeout=900)
    elapsed = time.monotonic() - started
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]

    found = _target_items(q)
    assert {k: sorted(v) for k, v in found.items()} == {k: sorted(v) for k, v in expected.items()}
    assert sum(len(v) for v in found.values()) == ITEMS  # each exactly once
    left = cassandra_session.execute(
        f"SELECT item_id FROM {cassandra_keyspace}.zone_rows WHERE kind = 1 ALLOW FILTERING"
    )
    assert list(left) == []
    # Fields survive: error count, priority, payload, attempts, unleased.
    sample = q.zones.get(q.zone("app1", "tenant00001"), "item000001")
    assert sample is not None
    assert (sample.error_count, sample.priority, sample.payload, sample.attempts) == (
        1,
        1,
        b"payload 1",
        1,
    )
    assert sample.lease_id is None
    # Every target zone has a pointer.
    pointers = {p.zone for p in q.toplevel.list_pointers(0)}
    assert {q.zone(a, t) for a, t in expected} <= pointers
    q.close()
    print(f"\nmigrated {ITEMS} items over {zones} zones with one SIGKILL in {elapsed:.1f}s")


def test_migration_into_postgres(
    cassandra_node: LocalCassandra,
    cassandra_session: Any,
    cassandra_keyspace: str,
) -> None:
    """``quick migrate --to postgresql://...``: every item lands once, with its pointer."""
    from quickzones.testing.provision.postgres import postgres_skip_reason
    from tests.postgres import postgres_store_url

    if postgres_skip_reason() is not None:
        pytest.skip(str(postgres_skip_reason()))
    url = cassandra_url(cassandra_node, cassandra_session, cassandra_keyspace)
    expected = _seed(cassandra_session, cassandra_keyspace, 300, 30)
    target = postgres_store_url()
    moved = CliRunner().invoke(main, ["migrate", "--from", url, "--to", target])
    assert moved.exit_code == 0, moved.output
    q = Quick.open(target)
    try:
        found = _target_items(q)
        assert {k: sorted(v) for k, v in found.items()} == {
            k: sorted(v) for k, v in expected.items()
        }
        pointers = {p.zone for p in q.toplevel.list_pointers(0)}
        assert {q.zone(a, t) for a, t in expected} <= pointers
    finally:
        q.close()
