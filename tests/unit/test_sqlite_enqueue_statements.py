"""A plain enqueue on SQLite, the embedded default, costs the file one transaction of few
statements (issue 44 point 1): the read snapshot becomes the write transaction when
nothing committed since it began, and the zone's count is added to by SQL, not read into
Python first. The meaning stays FoundationDB's: a commit after the snapshot is still
checked against the reads, and the atomic add keeps its width and wrap-around."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.store.kv import KVError, KVStore, KVTransaction, run
from tests.conftest import store_url

NOT_COMMITTED = 1020


def traced(q: Quick) -> list[str]:
    """Every statement the store's pooled connections run from now on."""
    statements: list[str] = []
    for conn in list(q.kv._pool):  # type: ignore[attr-defined]
        conn.set_trace_callback(statements.append)
    return statements


def test_an_enqueue_into_a_known_zone_is_one_short_sqlite_transaction(tmp_path: Path) -> None:
    q = Quick.open(store_url("sqlite", tmp_path))
    try:
        q.enqueue("job", {"n": 0}, app="a", tenant="t")  # makes the zone's pointer
        statements = traced(q)
        q.enqueue("job", {"n": 1}, app="a", tenant="t")
        begins = [s for s in statements if s.startswith("BEGIN")]
        commits = [s for s in statements if s == "COMMIT"]
        assert (len(begins), len(commits)) == (1, 1), statements
        # The count's atomic add is applied by SQL: no point read of its operand.
        assert not [s for s in statements if s.startswith("SELECT value FROM kv")], statements
        assert len(statements) <= 10, statements
        assert q.zones.count(q.zone("a", "t")) == 2
    finally:
        q.close()


def _other_thread(kv: KVStore, key: bytes, value: bytes) -> None:
    """A commit by another connection (another thread, as another process would)."""
    t = threading.Thread(target=run, args=(kv, lambda tr: tr.set(key, value)))
    t.start()
    t.join()


def test_a_commit_after_the_snapshot_still_conflicts_with_its_reads(tmp_path: Path) -> None:
    q = Quick.open(store_url("sqlite", tmp_path))
    try:
        run(q.kv, lambda tr: tr.set(b"a", b"0"))
        tr = q.kv.create_transaction()
        assert tr.get(b"a") == b"0"
        _other_thread(q.kv, b"a", b"1")
        tr.set(b"b", b"x")
        with pytest.raises(KVError) as err:
            tr.commit()
        assert err.value.code == NOT_COMMITTED
        assert run(q.kv, lambda t: t.get(b"b")) is None
    finally:
        q.close()


def test_a_commit_after_the_snapshot_elsewhere_lets_it_commit_after_that_one(
    tmp_path: Path,
) -> None:
    q = Quick.open(store_url("sqlite", tmp_path))
    try:
        run(q.kv, lambda tr: tr.set(b"a", b"0"))
        tr = q.kv.create_transaction()
        assert tr.get(b"a") == b"0"
        tr.add(b"n", (5).to_bytes(8, "little"))
        _other_thread(q.kv, b"c", b"1")
        other = q.kv.create_transaction()
        other_version = other.get_read_version()
        other.cancel()
        tr.set(b"b", b"x")
        tr.commit()
        assert tr.get_committed_version() > other_version
        assert run(q.kv, lambda t: (t.get(b"b"), t.get(b"c"), t.get(b"n"))) == (
            b"x",
            b"1",
            (5).to_bytes(8, "little"),
        )
    finally:
        q.close()


def _adds(tr: KVTransaction) -> None:
    tr.add(b"absent", (7).to_bytes(8, "little"))
    tr.add(b"short", (1).to_bytes(8, "little"))  # stored 2 bytes: zero-padded to 8
    tr.add(b"long", (1).to_bytes(2, "little"))  # stored 8 bytes: cut to 2
    tr.add(b"wrap", (1).to_bytes(2, "little"))  # 0xffff + 1 wraps to 0
    tr.add(b"twice", (2).to_bytes(4, "little"))
    tr.add(b"twice", (3).to_bytes(4, "little"))
    tr.add(b"widths", (1).to_bytes(4, "little"))
    tr.add(b"widths", (1).to_bytes(8, "little"))
    tr.add(b"empty", b"")


def _store_then_add(kv: KVStore) -> dict[bytes, bytes | None]:
    def seed(tr: KVTransaction) -> None:
        tr.set(b"short", (0x0102).to_bytes(2, "little"))
        tr.set(b"long", (0x0102_0304_0506_0708).to_bytes(8, "little"))
        tr.set(b"wrap", b"\xff\xff")
        tr.set(b"twice", (10).to_bytes(4, "little"))
        tr.set(b"widths", b"\x05")
        tr.set(b"empty", b"abc")

    run(kv, seed)
    run(kv, _adds)
    keys = [b"absent", b"short", b"long", b"wrap", b"twice", b"widths", b"empty"]
    return run(kv, lambda tr: {k: tr.get(k) for k in keys})


def test_atomic_adds_applied_by_sql_match_foundationdbs_meaning(tmp_path: Path) -> None:
    on_sqlite = Quick.open(store_url("sqlite", tmp_path))
    in_memory = Quick.open("memory://")
    try:
        got = _store_then_add(on_sqlite.kv)
        assert got == _store_then_add(in_memory.kv)
        assert got[b"wrap"] == b"\x00\x00"
        assert got[b"short"] == (0x0103).to_bytes(8, "little")
        assert got[b"twice"] == (15).to_bytes(4, "little")
    finally:
        on_sqlite.close()
        in_memory.close()


def test_threads_enqueueing_at_once_lose_nothing(tmp_path: Path) -> None:
    """Threads of one process commit one after another: each commit after the first
    finds its snapshot stale (or the lock taken) and falls back to the checked commit."""
    q = Quick.open(store_url("sqlite", tmp_path))
    failures: list[BaseException] = []

    def produce(tenant: str) -> None:
        try:
            for n in range(100):
                q.enqueue("job", {"n": n}, app="a", tenant=tenant)
        except BaseException as err:  # reported below, in the test's thread
            failures.append(err)

    try:
        threads = [threading.Thread(target=produce, args=(f"t{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert [q.zones.count(q.zone("a", f"t{i}")) for i in range(4)] == [100] * 4
        ran: list[int] = []
        q.job("job")(lambda payload, ctx: ran.append(payload["n"]))
        q.run_until_idle()
        assert sorted(ran) == sorted(list(range(100)) * 4)
    finally:
        q.close()
