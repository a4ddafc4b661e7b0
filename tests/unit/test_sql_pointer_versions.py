"""A zone's pointer under a held snapshot on PostgreSQL with ``zones=sql`` (issue 42 point
3): every visit and every enqueue into an idle zone rewrites its pointer, and while a
report's transaction keeps an old snapshot open, PostgreSQL keeps every version. A write
to a row whose key is unique checked each version kept (a uniqueness check per unique
index, each version a heap fetch), so a small zone's enqueue and requeue grew with the
zone's traffic since the snapshot: 4,000 buffers and 6 ms a write after 2,000 rewrites.
Pointer rows now carry a version and no unique index (the zone's uniqueness lives in a
registry row written only when the pointer is made or collected); a statement finds the
newest version first, so what it touches stays flat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.store.records import ZoneId
from quickzones.store.sql import SQLZoneStore
from quickzones.store.sql.toplevel import zone_key
from quickzones.testing.provision.postgres import postgres_skip_reason

# Enqueue-and-visit rounds, two pointer versions each: what a write touches is measured
# after the first and again after all of them.
ROUNDS = (100, 400)
MOST_BUFFERS = 60  # a write's, whatever the rounds kept (before: 2 a version kept)


def _url() -> str:
    reason = postgres_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from tests.postgres import postgres_store_url

    return postgres_store_url() + "&zones=sql"


def _buffers(conn: Any, sql: str, args: dict[str, Any]) -> int:
    """The shared buffers ``sql`` touches, run and rolled back: the most of its plan for
    these values and of the generic plan a prepared statement falls back to (quick's
    statements are prepared), whichever PostgreSQL would choose."""
    most = 0
    for mode in ("force_custom_plan", "force_generic_plan"):
        conn.execute(f"SET plan_cache_mode = {mode}")
        conn.execute("BEGIN")
        try:
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, args, prepare=True
            ).fetchone()
        finally:
            conn.execute("ROLLBACK")
        if isinstance(plan, str):
            plan = json.loads(plan)
        top = plan[0]["Plan"]
        most = max(
            most, int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
        )
    return most


def _writes(conn: Any, store: SQLZoneStore, zone: ZoneId) -> dict[str, int]:
    """The buffers an enqueue into ``zone`` and its pointer's requeue touch."""
    pointer = store.toplevel.get_pointer(zone)
    assert pointer is not None
    now = pointer.last_active_ms
    item = {"zone": zone_key(zone), "id": "probe", "priority": 0, "vesting_ms": now,
            "record": b"x"}  # fmt: skip
    enqueue = store.q.enqueue_one
    assert enqueue is not None
    requeue = {"cluster": store.toplevel.cluster, "pointer_id": pointer.pointer_id,
               "vesting_ms": now + 60_000, "last_active_ms": now}  # fmt: skip
    return {
        "an enqueue into the zone": _buffers(
            conn, enqueue, {**item, **store.toplevel.pointer_args(zone, now, now)}
        ),
        "the zone's requeue": _buffers(conn, store.q.requeue_pointer, requeue),
        # A batch's pull (enqueue_many), after its lock.
        "the pointer's pull": _buffers(
            conn,
            store.q.pull_pointer,
            {**store.toplevel.pointer_args(zone, now, now), "vesting_ms": now - 1_000},
        ),
    }


def test_a_small_zones_pointer_writes_stay_flat_beside_a_held_snapshot(tmp_path: Path) -> None:
    import psycopg

    url = _url()
    schema = url.split("schema=")[1].split("&")[0]
    q = Quick.open(url)
    q.job("j")(lambda payload, ctx: None)
    zone = ZoneId("a", "small")
    try:
        # 100 other zones idle, their pointers vesting later (the statistics PostgreSQL
        # plans with: most pointers past now, few vested).
        q.enqueue_many("j", [{"n": -1}], app="a", tenant="small")
        for t in range(100):
            q.enqueue("j", {"n": -1}, app="a", tenant=f"other{t}")
        assert q.run_until_idle() == 101
        store = q.items
        assert isinstance(store, SQLZoneStore)
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            with psycopg.connect(url.split("?")[0]) as report:
                report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                report.execute(f'SELECT count(*) FROM "{schema}".quick_items')  # the snapshot
                spent: list[dict[str, int]] = []
                done = 0
                for rounds in ROUNDS:
                    for n in range(done, rounds):
                        q.enqueue("j", {"n": n}, app="a", tenant="small")
                        assert q.run_until_idle() == 1
                    done = rounds
                    conn.execute("ANALYZE quick_pointers")
                    spent.append(_writes(conn, store, zone))
                report.execute("COMMIT")
        first, last = spent
        # Flat: 300 more rounds kept 600 more versions (before: 1,200 more buffers each).
        assert all(last[k] <= first[k] + 10 and last[k] <= MOST_BUFFERS for k in last), spent
    finally:
        q.close()


# The pointers table of the layout before versions, as the previous build made it.
UNVERSIONED = (
    "CREATE TABLE {ns}quick_pointers (cluster TEXT NOT NULL, zone {blob} NOT NULL,"
    " pointer_id TEXT NOT NULL, shard INTEGER NOT NULL, vesting_ms {int} NOT NULL,"
    " last_active_ms {int} NOT NULL, lease_id TEXT, holder TEXT, PRIMARY KEY (cluster, zone))",
    "CREATE UNIQUE INDEX quick_pointers_id ON {ns}quick_pointers (cluster, pointer_id)",
    "CREATE INDEX quick_pointers_order ON {ns}quick_pointers"
    " (cluster, shard, vesting_ms, pointer_id)",
)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_store_of_the_layout_before_versions_is_migrated_when_opened(
    tmp_path: Path, store: str
) -> None:
    """A zones=sql store whose pointers are one unique row a zone (the previous build's)
    is moved to the versioned layout by the first process that opens it: every queued
    item keeps its pointer and runs, once."""
    url = f"sqlite:///{tmp_path / 'q.db'}?zones=sql" if store == "sqlite" else _url()
    q = Quick.open(url)
    for n in range(5):
        q.enqueue("j", {"n": n}, app="a", tenant=f"t{n}")
    assert isinstance(q.items, SQLZoneStore)
    ns = q.items.q.pointers_table[: -len("quick_pointers")]
    q.close()
    _to_unversioned(url, store, ns)
    ran: list[Any] = []
    again = Quick.open(url)
    again.job("j")(lambda payload, ctx: ran.append(payload["n"]))
    try:
        assert again.run_until_idle() == 5
        assert sorted(ran) == list(range(5))
        again.enqueue("j", {"n": 5}, app="a", tenant="t0")
        assert again.run_until_idle() == 1
    finally:
        again.close()


def _to_unversioned(url: str, store: str, ns: str) -> None:
    """Rewrite the store's pointers as the previous build kept them."""
    copy = (
        f"INSERT INTO {ns}quick_pointers SELECT cluster, zone, pointer_id, shard, vesting_ms,"
        f" last_active_ms, lease_id, holder FROM {ns}quick_pointers_new"
    )
    steps = [
        f"ALTER TABLE {ns}quick_pointers RENAME TO quick_pointers_new",
        f"DROP INDEX {ns}quick_pointers_by_zone",
        f"DROP INDEX {ns}quick_pointers_by_id",
        f"DROP INDEX {ns}quick_pointers_vesting",
    ]
    kinds = {"blob": "BLOB", "int": "INTEGER"} if store == "sqlite" else {
        "blob": "bytea", "int": "bigint"}  # fmt: skip
    steps += [s.format(ns=ns, **kinds) for s in UNVERSIONED]
    steps += [copy, f"DROP TABLE {ns}quick_pointers_new", f"DROP TABLE {ns}quick_zones"]
    if store == "sqlite":
        import sqlite3

        conn = sqlite3.connect(url.split("sqlite:///")[1].split("?")[0])
        with conn:
            for step in steps:
                conn.execute(step)
        conn.close()
        return
    import psycopg

    with psycopg.connect(url.split("?")[0]) as conn:
        for step in steps:
            conn.execute(step)
