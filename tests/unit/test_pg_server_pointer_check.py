"""On PostgreSQL the enqueue's pointer check is made by the server at the commit
(``quick_ensure3``, ``kv.create_if_absent``): the zone's pointer and index entry are
written only where the zone has none then, and the commit fails (its next try reads) if
the cluster's layout moved since this process last read it. An enqueue into any zone is
one round trip, as a producer spreading jobs over many tenants makes them. These are the
user's complaints it must not bring back: two pointers for one zone, an item with none,
a pointer in the shard the layout no longer names, a zone whose pointer vests late."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from quickzones.backends.postgres.store import PostgresStore
from quickzones.client import Quick
from quickzones.store.kv import KVTransaction, run
from quickzones.store.layout import shard_for
from quickzones.store.records import ZoneId, decode_pointer
from quickzones.store.reshard import reshard
from quickzones.store.toplevel import IndexEntry, PointerRef
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.pg_round_trips import traced_round_trips
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


def _open(url: str, **options: str) -> Quick:
    query = "&".join(f"{k}={v}" for k, v in {"listen": "off", **options}.items())
    return Quick.open(f"{url}&{query}" if "?" in url else f"{url}?{query}")


@pytest.fixture
def url() -> str:
    return postgres_store_url()


def _round_trips(q: Quick, call: Any) -> int:
    store = q.kv
    assert isinstance(store, PostgresStore)
    return traced_round_trips(store, call)


def _pointers(q: Quick, zone: ZoneId) -> list[str]:
    """Every pointer record of ``zone`` in every shard the layout may use."""
    top = q.toplevel
    found: list[str] = []

    def read(tr: KVTransaction) -> None:
        found.clear()
        for shard in range(max(top.layout.polled, 8)):
            begin, end = top.keys.pointers_range(top.cluster, shard)
            for key, raw in tr.get_range(begin, end):
                pointer = decode_pointer(key, raw)
                if pointer.zone == zone:
                    found.append(pointer.pointer_id)

    run(q.kv, read)
    return found


def test_an_enqueue_into_a_zone_this_process_never_read_is_one_round_trip(url: str) -> None:
    """A producer spreading one-call enqueues over 1,000 tenants read each zone's pointer
    index entry before its commit: two round trips an enqueue (0.91x procrastinate's
    ``defer`` in ``bench.pg_app_txn``'s single producer). Now the commit alone, for a zone
    with no pointer and for one whose pointer vests in time."""
    q = _open(url)
    try:
        q.enqueue("j", {}, app="a", tenant="first")  # reads the layout once
        assert q.kv.guards  # type: ignore[attr-defined]
        assert _round_trips(q, lambda: q.enqueue("j", {}, app="a", tenant="new")) == 1
        assert _round_trips(q, lambda: q.enqueue("j", {}, app="a", tenant="new")) == 1
        assert len(_pointers(q, q.zone("a", "new"))) == 1
        assert q.zones.count(q.zone("a", "new")) == 2
    finally:
        q.close()


def test_a_transaction_enqueueing_into_many_tenants_is_one_round_trip(url: str) -> None:
    """A request that fans one job out to 20 tenants in one transaction (``q.transact``,
    ``tr=``): each enqueue read its zone's pointer index entry in a round trip of its own
    before the commit, 20 in all, one after another; now the commit alone, every zone's
    pointer check made by the server. Every item is run, one pointer a zone."""
    q = _open(url)
    try:
        q.enqueue("j", {}, app="a", tenant="first")  # reads the layout once
        tenants = [f"fan-{n}" for n in range(20)]

        def fan_out() -> None:
            q.transact(
                lambda tr: [q.enqueue("j", {"t": t}, app="a", tenant=t, tr=tr) for t in tenants]
            )

        assert _round_trips(q, fan_out) == 1
        for tenant in tenants:
            assert len(_pointers(q, q.zone("a", tenant))) == 1
        q.transact(lambda tr: [q.enqueue("j", {}, app="a", tenant=t, tr=tr) for t in tenants[:5]])
        ran: list[Any] = []
        q.job("j")(lambda payload, ctx: ran.append(payload))
        assert q.run_until_idle() == 1 + 20 + 5
    finally:
        q.close()


def test_a_transaction_into_many_zones_enqueued_into_a_moment_ago_is_one_round_trip(
    url: str,
) -> None:
    """What this store kept of its last commits answers a try's first read only: a
    request fanning out to 10 tenants this process enqueued into a moment ago read each
    zone but the first in a round trip of its own (the server's check was passed over,
    as for a zone whose read costs nothing), one after another, and the commit checked
    every read against the first zone's older snapshot, so the other zones' own
    enqueues since failed it and it ran again (21 round trips). Now the first zone's
    read comes from what was kept and every other zone's check is the server's: one."""
    q = _open(url)
    try:
        tenants = [f"fan-{n}" for n in range(10)]
        for tenant in tenants:
            q.enqueue("j", {}, app="a", tenant=tenant)

        def fan_out() -> None:
            q.transact(lambda tr: [q.enqueue("j", {}, app="a", tenant=t, tr=tr) for t in tenants])

        assert _round_trips(q, fan_out) == 1
        for tenant in tenants:
            assert len(_pointers(q, q.zone("a", tenant))) == 1
            assert q.zones.count(q.zone("a", tenant)) == 2
    finally:
        q.close()


def test_enqueue_many_into_a_new_zone_is_one_round_trip(url: str) -> None:
    """``enqueue_many`` of fresh ids reads nothing of its items; it read the layout and
    the zone's pointer index entry before its commit all the same (two round trips)."""
    q = _open(url)
    try:
        q.enqueue("j", {}, app="a", tenant="first")  # reads the layout once
        many = lambda: q.enqueue_many("j", [{"n": n} for n in range(50)], app="a", tenant="bulk")  # noqa: E731
        assert _round_trips(q, many) == 1
        assert len(_pointers(q, q.zone("a", "bulk"))) == 1
        assert q.zones.count(q.zone("a", "bulk")) == 50
    finally:
        q.close()


def test_without_the_server_check_the_enqueue_reads_first(url: str) -> None:
    """``server_pointer_check=off``: each enqueue into a zone not just read reads its
    index entry first (two round trips), as before."""
    q = _open(url, server_pointer_check="off")
    try:
        q.enqueue("j", {}, app="a", tenant="first")
        assert not q.kv.guards  # type: ignore[attr-defined]
        assert _round_trips(q, lambda: q.enqueue("j", {}, app="a", tenant="new")) == 2
    finally:
        q.close()


def test_the_option_is_checked(url: str) -> None:
    from quickzones.errors import InvalidStoreURL

    with pytest.raises(InvalidStoreURL, match="server_pointer_check='no': expected auto or off"):
        _open(url, server_pointer_check="no")


def test_many_stores_enqueueing_into_one_empty_zone_at_once_make_one_pointer(url: str) -> None:
    """Four processes' first enqueues into one zone race: the server makes the pointer
    for one commit only; every item is run."""
    stores = [_open(url) for _ in range(4)]
    try:
        for q in stores:
            q.enqueue("j", {}, app="a", tenant="warm")  # each has read the layout
        for round_ in range(5):
            tenant = f"race-{round_}"
            start = threading.Barrier(len(stores))

            def enqueue(q: Quick, tenant: str = tenant, start: threading.Barrier = start) -> None:
                start.wait()
                for n in range(3):
                    q.enqueue("j", {"n": n}, app="a", tenant=tenant)

            threads = [threading.Thread(target=enqueue, args=(q,)) for q in stores]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            zone = stores[0].zone("a", tenant)
            assert len(_pointers(stores[0], zone)) == 1
            assert stores[0].zones.count(zone) == 12
        ran: list[Any] = []
        stores[0].job("j")(lambda payload, ctx: ran.append(payload))
        assert stores[0].run_until_idle() == 4 + 5 * 12
    finally:
        for q in stores:
            q.close()


def _collect_pointer(q: Quick, zone: ZoneId) -> None:
    """Delete ``zone``'s pointer as pointer collection does once the zone is empty."""
    top = q.toplevel

    def collect(tr: KVTransaction) -> None:
        pointer = top.get_pointer(zone, tr=tr)
        assert pointer is not None
        shard = top.shard_for(zone)
        keys, cluster, pid = top.keys, top.cluster, pointer.pointer_id
        tr.get(keys.pointer_index_key(cluster, shard, zone))
        tr.clear(keys.pointer_key(cluster, shard, pid))
        tr.clear(keys.pointer_vesting_key(cluster, shard, pointer.vesting_ms, pid))
        tr.clear(keys.pointer_index_key(cluster, shard, zone))

    run(q.kv, collect)


def test_a_pointer_collected_by_another_process_is_made_again(url: str) -> None:
    q, other = _open(url), _open(url)
    ran: list[Any] = []
    other.job("j")(lambda payload, ctx: ran.append(payload["n"]))
    zone = q.zone("a", "t")
    try:
        for n in range(12):
            q.enqueue("j", {"n": n}, app="a", tenant="t")
            assert other.run_until_idle() == 1
            if n % 3 == 2:
                _collect_pointer(other, zone)
                assert q.toplevel.get_pointer(zone) is None
        assert ran == list(range(12))
    finally:
        q.close()
        other.close()


def test_an_enqueue_after_another_process_resharded_lands_where_the_layout_says(url: str) -> None:
    """This process last read a layout of 1 shard; another reshards to 4. Its next
    enqueue into a zone whose home is another shard now: the server's check of the layout
    fails the commit, the next try reads the new layout and makes the pointer at home
    (not in shard 0, where producers that read the layout would never look for it)."""
    q, admin = _open(url), _open(url)
    try:
        q.enqueue("j", {}, app="a", tenant="warm")
        assert q.toplevel.layout.shards == 1
        reshard(admin.toplevel, 4)
        tenant = next(f"z{n}" for n in range(100) if shard_for(q.zone("a", f"z{n}"), 4) != 0)
        zone = q.zone("a", tenant)
        q.enqueue("j", {}, app="a", tenant=tenant)
        assert q.toplevel.layout.shards == 4
        home = shard_for(zone, 4)
        top = admin.toplevel
        index = run(
            admin.kv, lambda tr: tr.get(top.keys.pointer_index_key(top.cluster, home, zone))
        )
        assert index is not None
        assert len(_pointers(admin, zone)) == 1
        admin.enqueue("j", {}, app="a", tenant=tenant)  # finds it at home: no second one
        assert len(_pointers(admin, zone)) == 1
    finally:
        q.close()
        admin.close()


def _commits(q: Quick) -> int:
    """quick commits on the store so far (each takes a version from its sequence)."""
    schema = q.kv.schema  # type: ignore[attr-defined]
    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT last_value FROM {}").format(sql.Identifier(schema, "quick_versions"))
        ).fetchone()
    assert row is not None
    return int(row[0])


def _drained(q: Quick, tenant: str) -> ZoneId:
    """A small tenant's zone as the last visit left it: emptied, its pointer requeued to
    vest ``min_inactive_s`` later."""
    q.enqueue("j", {"n": 1}, app="a", tenant=tenant)
    assert q.run_until_idle() == 1
    zone = q.zone("a", tenant)
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None and pointer.lease_id is None
    return zone


def test_a_zone_whose_pointer_vests_later_is_pulled_in_the_enqueue_s_own_commit(url: str) -> None:
    """A small tenant's usual enqueue: its zone's pointer was requeued to vest later when
    the last visit emptied the zone. Part two pulled it in a transaction of its own after
    the enqueue's: two round trips and two commits for every item of a tenant that
    enqueues now and then (three with the visit). Now the server pulls it in the
    enqueue's commit, where this process knows the zone's pointer: one round trip, one
    commit, and the item is picked up at once."""
    q = _open(url)
    try:
        q.job("j")(lambda payload, ctx: None)
        zone = _drained(q, "small")
        before = q.toplevel.get_pointer(zone)
        assert before is not None
        ids: list[str] = []
        commits = _commits(q)
        enqueue = lambda: ids.append(q.enqueue("j", {"n": 2}, app="a", tenant="small"))  # noqa: E731
        assert _round_trips(q, enqueue) == 1
        assert _commits(q) == commits + 1
        pointer = q.toplevel.get_pointer(zone)
        item = q.get("a", "small", ids[0])
        assert pointer is not None and item is not None
        assert before.vesting_ms > item.vesting_ms
        assert pointer.pointer_id == before.pointer_id and pointer.lease_id is None
        assert pointer.vesting_ms == item.vesting_ms  # pulled: picked up now
        assert pointer.last_active_ms >= before.last_active_ms
        # Its vesting entry moved with it: a scan finds it vested, and only once.
        assert len(_vesting_entries(q, zone)) == 1
        assert q.run_until_idle() == 1
    finally:
        q.close()


def _vesting_entries(q: Quick, zone: ZoneId) -> list[int]:
    """The vesting times of every vesting-index entry of ``zone``'s pointer."""
    top = q.toplevel
    pointer = top.get_pointer(zone)
    assert pointer is not None
    shard = top.shard_for(zone)
    prefix = top.keys.pointer_vesting_prefix(top.cluster, shard)
    entries = run(q.kv, lambda tr: [k for k, _ in tr.get_range(prefix, prefix + b"\xff")])
    found = [top.keys.unpack_pointer_vesting_key(top.cluster, shard, k) for k in entries]
    return [vesting for vesting, pid in found if pid == pointer.pointer_id]


def test_a_zone_whose_pointer_this_process_made_is_pulled_in_the_enqueue_s_commit(
    url: str,
) -> None:
    """A tenant's first job is delayed an hour (its pointer, made by this process's
    commit, vests then); its next job, after other tenants' (so nothing this store kept
    of the zone answers its reads), is due now: one commit, the pointer pulled."""
    q = _open(url)
    try:
        q.enqueue("j", {}, app="a", tenant="warm")  # reads the layout once
        q.enqueue("j", {"n": 1}, app="a", tenant="later", delay=3600)
        for n in range(40):
            q.enqueue("j", {}, app="a", tenant=f"other-{n}")
        zone = q.zone("a", "later")
        commits = _commits(q)
        q.enqueue("j", {"n": 2}, app="a", tenant="later")
        assert _commits(q) == commits + 1
        pointer = q.toplevel.get_pointer(zone)
        assert pointer is not None and pointer.vesting_ms <= int(q.clock.now() * 1000)
    finally:
        q.close()


def test_a_transaction_enqueueing_into_many_drained_zones_pulls_them_all_in_its_commit(
    url: str,
) -> None:
    """A request fanning one job out to 10 small tenants whose zones were emptied: one
    commit (and one round trip) for all, every pointer pulled to its item's time."""
    q = _open(url)
    q.job("j")(lambda payload, ctx: None)
    try:
        tenants = [f"fan-{n}" for n in range(10)]
        for tenant in tenants:
            q.enqueue("j", {}, app="a", tenant=tenant)
        assert q.run_until_idle() == 10
        for n in range(40):  # other tenants' jobs since: nothing kept answers its reads
            q.enqueue("j", {}, app="a", tenant=f"other-{n}")
        commits = _commits(q)

        def fan_out() -> None:
            q.transact(lambda tr: [q.enqueue("j", {}, app="a", tenant=t, tr=tr) for t in tenants])

        assert _round_trips(q, fan_out) == 1
        assert _commits(q) == commits + 1
        now = int(q.clock.now() * 1000)
        for tenant in tenants:
            pointer = q.toplevel.get_pointer(q.zone("a", tenant))
            assert pointer is not None and pointer.vesting_ms <= now
        assert q.run_until_idle() == 50
    finally:
        q.close()


def test_a_pulled_pointer_is_seen_by_a_consumer_of_another_process_at_once(url: str) -> None:
    """The pull is a commit like part two's: another process's consumer, whose scan read
    the vesting index before it, sees the zone vested and runs the item."""
    q, other = _open(url), _open(url)
    ran: list[Any] = []
    other.job("j")(lambda payload, ctx: ran.append(payload["n"]))
    try:
        other.enqueue("j", {"n": 0}, app="a", tenant="t")
        assert other.run_until_idle() == 1
        q.enqueue("j", {"n": 1}, app="a", tenant="t")  # learns the zone's pointer
        assert other.run_until_idle() == 1
        made = []
        for n in range(2, 6):
            commits = _commits(q)
            q.enqueue("j", {"n": n}, app="a", tenant="t")
            made.append(_commits(q) - commits)
            assert other.run_until_idle() == 1
        assert ran == list(range(6))
        # Where what this store kept of the record, a moment ago, said it vests in time,
        # the pull is left out and part two pulls it in a transaction of its own (once);
        # from then on the zone's enqueues pull at their commit.
        assert made.count(2) <= 1 and made[-2:] == [1, 1]
    finally:
        q.close()
        other.close()


def test_an_enqueue_into_a_busy_zone_leaves_the_pull_out(url: str) -> None:
    """A zone enqueued into a moment ago whose pointer vests in time (a busy tenant's):
    the store knows it from the read after its last commit, so the commit does not carry
    the pull (the server's call cost as much as the rest of the commit: one producer
    into one tenant went from 1,170-1,430 to 990-1,140 enqueues a second). A drained
    zone's enqueue carries it."""
    q = _open(url)
    q.job("j")(lambda payload, ctx: None)
    try:
        _drained(q, "quiet")
        q.enqueue("j", {}, app="a", tenant="quiet")  # part two pulled it in its own
        assert q.run_until_idle() == 1
        q.enqueue("j", {}, app="a", tenant="busy")
        q.enqueue("j", {}, app="a", tenant="busy")
        top = q.toplevel

        def asks(tenant: str) -> bool:
            zone = q.zone("a", tenant)
            shard = top.shard_for(zone)
            key = top.keys.pointer_index_key(top.cluster, shard, zone)
            index = run(q.kv, lambda tr: tr.get(key))
            assert index is not None
            tr = q.kv.create_transaction()
            tr.set(b"probe", b"1")
            found = IndexEntry(shard, index)
            return top.pull_at_commit(tr, zone, int(q.clock.now() * 1000), found)

        assert not asks("busy")
        assert asks("quiet")
    finally:
        q.close()


def test_a_leased_pointer_is_left_to_its_holder(url: str) -> None:
    """A consumer holds the zone's pointer (its visit under way): the enqueue's commit
    leaves the record as the holder wrote it (the holder requeues it reading the zone)."""
    q = _open(url)
    try:
        q.job("j")(lambda payload, ctx: None)
        zone = _drained(q, "held")
        top = q.toplevel
        shard = top.shard_for(zone)
        pointer = top.get_pointer(zone)
        assert pointer is not None
        ref = PointerRef(shard, pointer.pointer_id, pointer.vesting_ms, top.cluster)
        top.obtain_pointer_lease(ref, 60_000, horizon_ms=60_000)
        key = top.keys.pointer_key(top.cluster, shard, pointer.pointer_id)
        record = run(q.kv, lambda tr: tr.get(key))
        q.enqueue("j", {"n": 2}, app="a", tenant="held")
        assert run(q.kv, lambda tr: tr.get(key)) == record
    finally:
        q.close()


def test_a_pointer_that_vests_in_time_is_not_rewritten(url: str) -> None:
    q = _open(url)
    try:
        q.enqueue("j", {"n": 1}, app="a", tenant="busy")
        zone = q.zone("a", "busy")
        before = q.toplevel.get_pointer(zone)
        commits = _commits(q)
        q.enqueue("j", {"n": 2}, app="a", tenant="busy", delay=30)
        assert _commits(q) == commits + 1
        assert q.toplevel.get_pointer(zone) == before
    finally:
        q.close()


def test_a_pointer_collected_and_made_again_elsewhere_is_not_pulled_by_its_old_id(url: str) -> None:
    """This process knows the zone's old pointer; another collected it and made a new
    one (vesting later, as after a visit). The enqueue's commit finds the index naming
    another pointer: it pulls nothing by the old id, and part two, as before, pulls the
    new one; one pointer, and the item runs."""
    q, other = _open(url), _open(url)
    other.job("j")(lambda payload, ctx: None)
    try:
        q.enqueue("j", {"n": 1}, app="a", tenant="t")
        zone = q.zone("a", "t")
        assert other.run_until_idle() == 1
        _collect_pointer(other, zone)
        _drained(other, "t")
        q.enqueue("j", {"n": 3}, app="a", tenant="t")
        assert len(_pointers(q, zone)) == 1
        pointer = q.toplevel.get_pointer(zone)
        assert pointer is not None
        assert pointer.vesting_ms <= int(q.clock.now() * 1000)  # vested: the item runs now
        assert other.run_until_idle() == 1
    finally:
        q.close()
        other.close()


def _drop(url: str, function: str, arguments: str) -> None:
    """Drop one of the store's functions, as a quick of before it left the schema."""
    schema = url.split("schema=")[1].split("&")[0]
    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP FUNCTION {}(" + arguments + ")").format(sql.Identifier(schema, function))
        )


def _drop_function(url: str) -> None:
    _drop(url, "quick_ensure3", "bytea[], int[], bytea[], bytea[], bytea[], bytea[], text, text")


def test_a_store_made_before_the_server_check_gains_it_on_opening(url: str) -> None:
    q = _open(url)
    q.enqueue("j", {}, app="a", tenant="t")
    q.close()
    _drop_function(url)  # as a quick of before this change left the schema
    q = _open(url)
    try:
        assert q.kv.guards  # type: ignore[attr-defined]
        q.enqueue("j", {}, app="a", tenant="t")
        q.enqueue("j", {}, app="a", tenant="u")
        assert q.zones.count(q.zone("a", "t")) == 2
        assert len(_pointers(q, q.zone("a", "u"))) == 1
    finally:
        q.close()


def _drop_pull_function(url: str) -> None:
    arguments = "bytea[], bytea[], bytea[], bytea[], bigint[], bytea[], bytea[], bytea[], bytea[]"
    _drop(url, "quick_pull3", arguments + ", text, text")


def test_a_store_made_before_part_two_at_commit_gains_it_on_opening(url: str) -> None:
    q = _open(url)
    q.job("j")(lambda payload, ctx: None)
    _drained(q, "t")
    q.close()
    _drop_pull_function(url)  # as a quick of before this change left the schema
    q = _open(url)
    q.job("j")(lambda payload, ctx: None)
    try:
        assert q.kv.pulls  # type: ignore[attr-defined]
        q.enqueue("j", {}, app="a", tenant="t")  # learns the zone's pointer
        assert q.run_until_idle() == 1
        commits = _commits(q)
        q.enqueue("j", {}, app="a", tenant="t")
        assert _commits(q) == commits + 1
        assert q.run_until_idle() == 1
    finally:
        q.close()


@pytest.fixture
def restricted(url: str) -> Iterator[str]:
    """``url``'s store, made by the server's owner, opened by a role with the table
    privileges quick needs and no CREATE on the schema."""
    q = _open(url)
    q.close()
    schema = url.split("schema=")[1].split("&")[0]
    role = f"{schema}_app"
    with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
        ident = sql.Identifier(role)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), ident)
        )
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                sql.Identifier(schema), ident
            )
        )
        conn.execute(
            sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
                sql.Identifier(schema), ident
            )
        )
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc.split("@")[-1]
    try:
        yield urlunsplit((parts.scheme, f"{role}@{netloc}", parts.path, parts.query, ""))
    finally:
        with psycopg.connect(shared_postgres_url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_that_may_not_add_the_server_check_enqueues_reading_first(
    url: str, restricted: str
) -> None:
    _drop_function(url)
    q = _open(restricted)
    try:
        assert not q.kv.guards  # type: ignore[attr-defined]
        q.enqueue("j", {}, app="a", tenant="t")
        q.enqueue("j", {}, app="a", tenant="t")
        assert q.zones.count(q.zone("a", "t")) == 2
        assert len(_pointers(q, q.zone("a", "t"))) == 1
    finally:
        q.close()


def test_a_role_that_may_not_add_part_two_at_commit_pulls_in_a_transaction_of_its_own(
    url: str, restricted: str
) -> None:
    _drop_pull_function(url)
    q = _open(restricted)
    q.job("j")(lambda payload, ctx: None)
    try:
        assert q.kv.guards and not q.kv.pulls  # type: ignore[attr-defined]
        zone = _drained(q, "t")
        q.enqueue("j", {}, app="a", tenant="t")
        pointer = q.toplevel.get_pointer(zone)
        assert pointer is not None and pointer.vesting_ms <= int(q.clock.now() * 1000)
        assert q.run_until_idle() == 1
    finally:
        q.close()
