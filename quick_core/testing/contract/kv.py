"""The KV conformance suite: the semantics of ``docs/fdb-semantics.md`` that every KV
backend must have, shipped so an out-of-tree backend runs the same checks.

Each ``test_*`` function takes its store from fixtures. To run the suite on a backend,
star-import this module into a test module and provide the fixtures (in that module or a
``conftest.py``)::

    from quickzones.testing.contract.kv import *  # noqa: F403 - the suite's test functions

    @pytest.fixture
    def kv_store(tmp_path): ...     # a fresh, empty KVStore; close it after the test

    @pytest.fixture
    def manual_clock(): ...         # the ManualClock that store reads, or pytest.skip()
                                    # if it reads real time (tests that step time skip)

The functions can also be called directly with those keyword arguments. Nothing here
knows which backend it runs on. Imports pytest: only tests import this module.
"""

from __future__ import annotations

import struct
import threading

import pytest

from quickzones.clock import ManualClock
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    COMMIT_UNKNOWN_RESULT,
    KEY_OUTSIDE_LEGAL_RANGE,
    KEY_SIZE_LIMIT,
    KEY_TOO_LARGE,
    NOT_COMMITTED,
    TRANSACTION_TIMED_OUT,
    TRANSACTION_TOO_LARGE,
    TRANSACTION_TOO_OLD,
    VALUE_SIZE_LIMIT,
    VALUE_TOO_LARGE,
    KVError,
    KVStore,
    KVTransaction,
    pack_i64,
    run,
    unpack_i64,
)

P = b"conf/"  # every key of this suite lives under one prefix


def put(store: KVStore, items: dict[bytes, bytes]) -> None:
    def fn(tr: KVTransaction) -> None:
        for key, value in items.items():
            tr.set(key, value)

    run(store, fn)


def read_all(store: KVStore, begin: bytes = P, end: bytes = P + b"\xff") -> dict[bytes, bytes]:
    return dict(run(store, lambda tr: tr.get_range(begin, end)))


def expect_code(code: int, fn: object, *args: object) -> KVError:
    assert callable(fn)
    with pytest.raises(KVError) as info:
        fn(*args)
    assert info.value.code == code, str(info.value)
    return info.value


# --- ordering and range reads -------------------------------------------------------------


def test_keys_sort_in_memcmp_order(kv_store: KVStore) -> None:
    keys = [
        P,
        P + b"\x00",
        P + b"\x00\x00",
        P + b"\x00\xff",
        P + b"\x01",
        P + b"a",
        P + b"a\x00",
        P + b"a\xff",
        P + b"ab",
        P + b"b",
        P + b"\x7f",
        P + b"\x80",
        P + b"\xfe\xff",
        P + b"\xff",
        P + b"\xff\x00",
        P + b"\xff\xff\xff",
    ]
    put(kv_store, {k: bytes([i]) for i, k in enumerate(reversed(keys))})
    got = run(kv_store, lambda tr: tr.get_range(P, P + b"\xff\xff\xff\xff"))
    assert [k for k, _ in got] == sorted(keys)
    got_rev = run(kv_store, lambda tr: tr.get_range(P, P + b"\xff\xff\xff\xff", reverse=True))
    assert [k for k, _ in got_rev] == sorted(keys, reverse=True)


def test_values_are_byte_exact(kv_store: KVStore) -> None:
    values = {P + b"empty": b"", P + b"nul": b"\x00\x00", P + b"all": bytes(range(256))}
    put(kv_store, values)
    assert read_all(kv_store) == values
    assert run(kv_store, lambda tr: tr.get(P + b"empty")) == b""
    assert run(kv_store, lambda tr: tr.get(P + b"missing")) is None


def test_range_limit_reverse_and_bounds(kv_store: KVStore) -> None:
    keys = [P + b"k%d" % i for i in range(10)]
    put(kv_store, {k: k[-1:] for k in keys})

    def reads(tr: KVTransaction) -> dict[str, list[bytes]]:
        return {
            "all": [k for k, _ in tr.get_range(P + b"k", P + b"l")],
            "first3": [k for k, _ in tr.get_range(P + b"k", P + b"l", limit=3)],
            "last3": [k for k, _ in tr.get_range(P + b"k", P + b"l", limit=3, reverse=True)],
            "half_open": [k for k, _ in tr.get_range(keys[2], keys[5])],
            "empty": [k for k, _ in tr.get_range(keys[5], keys[5])],
            "inverted": [k for k, _ in tr.get_range(keys[6], keys[2])],
            "big_limit": [k for k, _ in tr.get_range(keys[8], P + b"l", limit=100)],
        }

    got = run(kv_store, reads)
    assert got["all"] == keys
    assert got["first3"] == keys[:3]
    assert got["last3"] == [keys[9], keys[8], keys[7]]
    assert got["half_open"] == keys[2:5]
    assert got["empty"] == []
    assert got["inverted"] == []
    assert got["big_limit"] == keys[8:]


def test_system_keyspace_is_rejected(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    expect_code(KEY_OUTSIDE_LEGAL_RANGE, tr.set, b"\xff/x", b"v")
    expect_code(KEY_OUTSIDE_LEGAL_RANGE, tr.get, b"\xff")
    expect_code(KEY_OUTSIDE_LEGAL_RANGE, tr.get_range, b"a", b"\xff\x00")
    assert tr.get_range(b"\xfe", b"\xff") == []  # b"\xff" itself is a legal end


# --- read-your-writes ------------------------------------------------------------------------


def test_get_sees_own_sets_clears_and_atomics(kv_store: KVStore) -> None:
    put(kv_store, {P + b"a": b"1", P + b"b": b"2", P + b"n": pack_i64(10)})

    def fn(tr: KVTransaction) -> list[bytes | None]:
        tr.set(P + b"a", b"one")
        tr.clear(P + b"b")
        tr.set(P + b"c", b"3")
        tr.add(P + b"n", pack_i64(5))
        tr.add(P + b"fresh", pack_i64(7))
        return [tr.get(P + k) for k in (b"a", b"b", b"c", b"n", b"fresh")]

    assert run(kv_store, fn) == [b"one", None, b"3", pack_i64(15), pack_i64(7)]
    assert read_all(kv_store) == {
        P + b"a": b"one",
        P + b"c": b"3",
        P + b"n": pack_i64(15),
        P + b"fresh": pack_i64(7),
    }


def test_get_range_merges_local_writes_with_limit_and_reverse(kv_store: KVStore) -> None:
    put(kv_store, {P + b"%d" % i: b"db" for i in range(10)})

    def fn(tr: KVTransaction) -> dict[str, list[tuple[bytes, bytes]]]:
        tr.clear_range(P + b"2", P + b"6")  # hides 2..5
        tr.set(P + b"4", b"new")  # set after the clear shows again
        tr.set(P + b"1", b"over")  # overwrite
        tr.clear(P + b"8")
        tr.set(P + b"8a", b"ins")  # insert between stored keys
        tr.add(P + b"9", pack_i64(1))  # atomic on a stored non-integer value
        return {
            "all": tr.get_range(P, P + b"\xff"),
            "first3": tr.get_range(P, P + b"\xff", limit=3),
            "last2": tr.get_range(P, P + b"\xff", limit=2, reverse=True),
            "mid_rev": tr.get_range(P + b"1", P + b"8a", reverse=True, limit=3),
        }

    got = run(kv_store, fn)
    nine = pack_i64(int.from_bytes(b"db".ljust(8, b"\x00"), "little") + 1)
    expected = [
        (P + b"0", b"db"),
        (P + b"1", b"over"),
        (P + b"4", b"new"),
        (P + b"6", b"db"),
        (P + b"7", b"db"),
        (P + b"8a", b"ins"),
        (P + b"9", nine),
    ]
    assert got["all"] == expected
    assert got["first3"] == expected[:3]
    assert got["last2"] == [expected[6], expected[5]]
    assert got["mid_rev"] == [expected[4], expected[3], expected[2]]
    assert list(read_all(kv_store).items()) == expected


def test_clear_range_then_reads_see_nothing_of_storage(kv_store: KVStore) -> None:
    put(kv_store, {P + b"x%d" % i: b"v" for i in range(5)})

    def fn(tr: KVTransaction) -> tuple[object, ...]:
        tr.clear_range(P + b"x", P + b"y")
        return (tr.get(P + b"x1"), tr.get_range(P + b"x", P + b"y"))

    assert run(kv_store, fn) == (None, [])
    assert read_all(kv_store) == {}


# --- conflicts ---------------------------------------------------------------------------------


def test_loser_of_a_read_modify_write_race_gets_not_committed(kv_store: KVStore) -> None:
    key = P + b"counter"
    put(kv_store, {key: pack_i64(0)})
    first, second = kv_store.create_transaction(), kv_store.create_transaction()
    a = unpack_i64(first.get(key))
    b = unpack_i64(second.get(key))
    second.set(key, pack_i64(b + 1))
    second.commit()
    first.set(key, pack_i64(a + 1))
    expect_code(NOT_COMMITTED, first.commit)
    assert run(kv_store, lambda tr: unpack_i64(tr.get(key))) == 1


def test_concurrent_increments_are_serializable(kv_store: KVStore) -> None:
    key = P + b"counter"
    threads, per_thread = 4, 25
    errors: list[BaseException] = []

    def increment(tr: KVTransaction) -> None:
        tr.set(key, pack_i64(unpack_i64(tr.get(key)) + 1))

    def worker() -> None:
        try:
            for _ in range(per_thread):
                run(kv_store, increment)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert run(kv_store, lambda tr: unpack_i64(tr.get(key))) == threads * per_thread


def test_snapshot_reads_do_not_conflict(kv_store: KVStore) -> None:
    key = P + b"k"
    put(kv_store, {key: b"0"})
    reader = kv_store.create_transaction()
    assert reader.get(key, snapshot=True) == b"0"
    assert reader.get_range(P, P + b"\xff", snapshot=True) == [(key, b"0")]
    put(kv_store, {key: b"1"})
    reader.set(P + b"other", b"x")
    reader.commit()  # no read conflict range covers `key`


def test_snapshot_reads_see_own_writes(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.set(P + b"k", b"mine")
    assert tr.get(P + b"k", snapshot=True) == b"mine"
    assert tr.get_range(P, P + b"\xff", snapshot=True) == [(P + b"k", b"mine")]


def test_explicit_read_conflict_range_conflicts(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.get_read_version()
    tr.add_read_conflict_range(P + b"r", P + b"s")
    tr.set(P + b"out", b"x")
    put(kv_store, {P + b"r5": b"w"})
    expect_code(NOT_COMMITTED, tr.commit)


def test_explicit_read_conflict_key_conflicts(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.get_read_version()
    tr.add_read_conflict_key(P + b"rk")
    tr.set(P + b"out", b"x")
    put(kv_store, {P + b"rk": b"w"})
    expect_code(NOT_COMMITTED, tr.commit)


def test_declared_write_conflict_fails_a_concurrent_reader(kv_store: KVStore) -> None:
    key = P + b"guarded"
    reader = kv_store.create_transaction()
    assert reader.get(key) is None
    reader.set(P + b"elsewhere", b"x")

    def declare(tr: KVTransaction) -> None:
        tr.add_write_conflict_key(key)  # writes nothing, still conflicts

    run(kv_store, declare)
    expect_code(NOT_COMMITTED, reader.commit)
    assert run(kv_store, lambda tr: tr.get(key)) is None


def test_blind_writes_never_conflict(kv_store: KVStore) -> None:
    key = P + b"blind"
    first, second = kv_store.create_transaction(), kv_store.create_transaction()
    first.set(key, b"1")
    first.add(P + b"n", pack_i64(1))
    second.set(key, b"2")
    second.add(P + b"n", pack_i64(1))
    second.commit()
    first.commit()
    assert read_all(kv_store) == {key: b"1", P + b"n": pack_i64(2)}


def test_read_only_transactions_never_conflict(kv_store: KVStore) -> None:
    key = P + b"ro"
    put(kv_store, {key: b"old"})
    reader = kv_store.create_transaction()
    assert reader.get(key) == b"old"
    put(kv_store, {key: b"new"})
    assert reader.get(key) == b"old"  # still its snapshot
    reader.commit()


def test_own_writes_add_no_read_conflict(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.get_read_version()
    tr.set(P + b"own", b"mine")
    tr.clear_range(P + b"c", P + b"d")
    assert tr.get(P + b"own") == b"mine"
    assert tr.get_range(P + b"c", P + b"d") == []
    put(kv_store, {P + b"own": b"theirs", P + b"c1": b"theirs"})
    tr.commit()
    assert read_all(kv_store) == {P + b"own": b"mine"}


def test_reading_a_pending_atomic_op_adds_a_read_conflict(kv_store: KVStore) -> None:
    key = P + b"n"
    tr = kv_store.create_transaction()
    tr.add(key, pack_i64(1))
    assert tr.get(key) == pack_i64(1)
    put(kv_store, {key: pack_i64(100)})
    expect_code(NOT_COMMITTED, tr.commit)


def test_atomic_op_alone_does_not_conflict(kv_store: KVStore) -> None:
    key = P + b"n"
    tr = kv_store.create_transaction()
    tr.get_read_version()
    tr.add(key, pack_i64(1))
    put(kv_store, {key: pack_i64(100)})
    tr.commit()
    assert run(kv_store, lambda t: unpack_i64(t.get(key))) == 101


def test_limited_range_read_conflicts_only_up_to_the_last_key(kv_store: KVStore) -> None:
    r = P + b"r/"
    put(kv_store, {r + b"%d" % i: b"v" for i in range(6)})

    def attempt(reverse: bool, write_key: bytes) -> bool:
        tr = kv_store.create_transaction()
        got = tr.get_range(r, r + b"\xff", limit=2, reverse=reverse)
        assert [k for k, _ in got] == ([r + b"5", r + b"4"] if reverse else [r + b"0", r + b"1"])
        tr.set(P + b"out", b"x")
        put(kv_store, {write_key: b"w"})
        try:
            tr.commit()
        except KVError as err:
            assert err.code == NOT_COMMITTED
            return False
        return True

    # Forward limit 2 reads 0, 1: conflict range [r, keyAfter(r1)).
    assert attempt(False, r + b"1\x00") is True
    assert attempt(False, r + b"1") is False
    assert attempt(False, r) is False
    # Reverse limit 2 reads 5, 4: conflict range [r4, r + \xff).
    assert attempt(True, r + b"3") is True
    assert attempt(True, r + b"4") is False
    assert attempt(True, r + b"9") is False


def test_exhausted_range_read_conflicts_on_inserts(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    assert tr.get_range(P + b"a", P + b"b") == []
    tr.set(P + b"out", b"x")
    put(kv_store, {P + b"a-phantom": b"w"})
    expect_code(NOT_COMMITTED, tr.commit)


# --- atomic operations -------------------------------------------------------------------------


def test_atomic_add_max_min(kv_store: KVStore) -> None:
    put(kv_store, {P + b"add": pack_i64(40), P + b"max": pack_i64(5), P + b"min": pack_i64(5)})

    def fn(tr: KVTransaction) -> None:
        tr.add(P + b"add", pack_i64(2))
        tr.add(P + b"add_missing", pack_i64(-3))
        tr.max(P + b"max", pack_i64(9))
        tr.max(P + b"max_missing", pack_i64(4))
        tr.min(P + b"min", pack_i64(2))
        tr.min(P + b"min_missing", pack_i64(4))
        tr.min(P + b"min_keep", pack_i64(1))
        tr.min(P + b"min_keep", pack_i64(3))

    run(kv_store, fn)
    got = read_all(kv_store)
    assert unpack_i64(got[P + b"add"]) == 42
    assert unpack_i64(got[P + b"add_missing"]) == -3
    assert unpack_i64(got[P + b"max"]) == 9
    assert unpack_i64(got[P + b"max_missing"]) == 4
    assert unpack_i64(got[P + b"min"]) == 2
    assert unpack_i64(got[P + b"min_missing"]) == 4
    assert unpack_i64(got[P + b"min_keep"]) == 1


def test_atomic_add_wraps_and_fits_width(kv_store: KVStore) -> None:
    put(kv_store, {P + b"short": b"\x01", P + b"wrap": b"\xff\xff"})

    def fn(tr: KVTransaction) -> None:
        tr.add(P + b"short", struct.pack("<I", 1))  # existing zero-padded to 4 bytes
        tr.add(P + b"wrap", b"\x01\x00")  # wraps modulo 2**16

    run(kv_store, fn)
    got = read_all(kv_store)
    assert got[P + b"short"] == struct.pack("<I", 2)
    assert got[P + b"wrap"] == b"\x00\x00"


def test_max_is_unsigned_little_endian(kv_store: KVStore) -> None:
    put(kv_store, {P + b"m": b"\x00\x01"})  # 256
    run(kv_store, lambda tr: tr.max(P + b"m", b"\xff\x00"))  # 255
    assert read_all(kv_store)[P + b"m"] == b"\x00\x01"


def test_atomic_ops_are_applied_at_commit_to_the_latest_value(kv_store: KVStore) -> None:
    key = P + b"n"
    put(kv_store, {key: pack_i64(1)})
    tr = kv_store.create_transaction()
    tr.add(key, pack_i64(10))
    put(kv_store, {key: pack_i64(100)})
    tr.commit()
    assert unpack_i64(read_all(kv_store)[key]) == 110


# --- versionstamps ------------------------------------------------------------------------------


def vs_key(prefix: bytes, suffix: bytes = b"") -> bytes:
    """A key template with a 10-byte placeholder after ``prefix`` and its LE offset."""
    return prefix + b"\x00" * 10 + suffix + struct.pack("<I", len(prefix))


def test_versionstamped_keys_are_unique_increasing_and_shared_in_a_txn(kv_store: KVStore) -> None:
    stamps: list[bytes] = []
    for i in range(3):
        tr = kv_store.create_transaction()
        tr.set_versionstamped_key(vs_key(P + b"log/", b"a"), b"%d" % i)
        tr.set_versionstamped_key(vs_key(P + b"log/", b"b"), b"%d" % i)
        future = tr.get_versionstamp()
        tr.commit()
        stamps.append(future.result())
    assert all(len(s) == 10 for s in stamps)
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    keys = list(read_all(kv_store))
    expected = [P + b"log/" + s + suffix for s in stamps for suffix in (b"a", b"b")]
    assert keys == expected


def test_versionstamp_is_commit_version_big_endian(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.set_versionstamped_value(P + b"v", b"pre" + b"\x00" * 10 + struct.pack("<I", 3))
    future = tr.get_versionstamp()
    tr.commit()
    stamp = future.result()
    commit_version = getattr(tr, "get_committed_version", lambda: None)()
    if commit_version is not None:
        assert struct.unpack(">Q", stamp[:8])[0] == commit_version
    assert read_all(kv_store) == {P + b"v": b"pre" + stamp}


def test_reading_versionstamped_writes_in_the_same_txn_is_unreadable(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.set_versionstamped_value(P + b"v", b"\x00" * 10 + struct.pack("<I", 0))
    expect_code(ACCESSED_UNREADABLE, tr.get, P + b"v")
    tr.set_versionstamped_key(vs_key(P + b"log/"), b"x")
    expect_code(ACCESSED_UNREADABLE, tr.get_range, P + b"log/", P + b"log0")
    assert tr.get_range(P + b"a", P + b"b") == []  # other ranges stay readable


def test_versionstamp_offset_out_of_bounds_is_rejected(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    with pytest.raises(KVError):
        tr.set_versionstamped_key(P + b"short" + struct.pack("<I", 3), b"")


# --- size limits ------------------------------------------------------------------------------


def test_key_and_value_size_limits(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.set(P + b"k" * (KEY_SIZE_LIMIT - len(P)), b"ok")
    tr.set(P + b"big", b"v" * VALUE_SIZE_LIMIT)
    expect_code(KEY_TOO_LARGE, tr.set, b"k" * (KEY_SIZE_LIMIT + 1), b"v")
    expect_code(VALUE_TOO_LARGE, tr.set, P + b"v", b"v" * (VALUE_SIZE_LIMIT + 1))
    expect_code(KEY_TOO_LARGE, tr.add, b"k" * (KEY_SIZE_LIMIT + 1), pack_i64(1))
    assert tr.get(b"k" * (KEY_SIZE_LIMIT + 1)) is None  # over-long keys read as absent
    tr.commit()
    assert len(read_all(kv_store)[P + b"big"]) == VALUE_SIZE_LIMIT


def test_transaction_too_large_at_commit(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    for i in range(101):  # 101 x 100,000 B > 10,000,000 B
        tr.set(P + b"%03d" % i, b"x" * VALUE_SIZE_LIMIT)
    err = expect_code(TRANSACTION_TOO_LARGE, tr.commit)
    assert not err.retryable
    assert read_all(kv_store) == {}


def test_nine_megabytes_commit(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    for i in range(90):
        tr.set(P + b"%03d" % i, b"x" * VALUE_SIZE_LIMIT)
    tr.commit()
    assert len(read_all(kv_store)) == 90


# --- commit callbacks -----------------------------------------------------------------------


def test_on_commit_runs_after_the_commit_and_sees_it(kv_store: KVStore) -> None:
    seen: list[bytes | None] = []
    tr = kv_store.create_transaction()
    tr.set(P + b"k", b"v")
    tr.on_commit(lambda: seen.append(run(kv_store, lambda t: t.get(P + b"k"))))
    tr.on_commit(lambda: seen.append(b"second"))
    assert seen == []
    tr.commit()
    assert seen == [b"v", b"second"]


def test_on_commit_dropped_by_failed_attempts_and_reset(kv_store: KVStore) -> None:
    calls: list[str] = []
    put(kv_store, {P + b"k": b"0"})
    tr = kv_store.create_transaction()
    tr.get(P + b"k")
    tr.set(P + b"mine", b"1")
    tr.on_commit(lambda: calls.append("conflicted"))
    put(kv_store, {P + b"k": b"1"})  # a later commit writes what tr read
    err = expect_code(NOT_COMMITTED, tr.commit)
    tr.on_error(err)  # retryable: resets, dropping the failed attempt's callbacks
    tr.set(P + b"mine", b"2")
    tr.on_commit(lambda: calls.append("retry"))
    tr.commit()
    assert calls == ["retry"]

    tr = kv_store.create_transaction()
    tr.set(P + b"mine", b"3")
    tr.on_commit(lambda: calls.append("reset"))
    tr.reset()
    tr.set(P + b"mine", b"4")
    tr.commit()
    assert calls == ["retry"]


def test_run_calls_on_commit_once_per_successful_commit(kv_store: KVStore) -> None:
    calls: list[int] = []
    attempts: list[int] = []
    put(kv_store, {P + b"k": b"0"})

    def body(tr: KVTransaction) -> None:
        attempts.append(1)
        tr.get(P + b"k")
        tr.set(P + b"out", b"x")
        tr.on_commit(lambda: calls.append(len(attempts)))
        if len(attempts) == 1:
            put(kv_store, {P + b"k": b"1"})  # the first attempt conflicts

    run(kv_store, body)
    assert attempts == [1, 1] and calls == [2]


# --- lifetime, timeout and the retry loop -----------------------------------------------------


def test_transaction_too_old_after_five_seconds(
    kv_store: KVStore, manual_clock: ManualClock
) -> None:
    put(kv_store, {P + b"a": b"1"})
    tr = kv_store.create_transaction()
    assert tr.get(P + b"a") == b"1"
    tr.set(P + b"mine", b"x")
    manual_clock.advance(4.9)
    assert tr.get(P + b"b") is None  # still young enough
    manual_clock.advance(0.2)
    assert tr.get(P + b"a") == b"1"  # already read: served from the transaction's cache
    assert tr.get(P + b"mine") == b"x"  # own writes need no storage read
    expect_code(TRANSACTION_TOO_OLD, tr.get, P + b"other")
    err = expect_code(TRANSACTION_TOO_OLD, tr.commit)
    assert err.retryable
    tr.on_error(err)
    assert tr.get(P + b"a") == b"1"  # on_error reset it to a fresh read version


def test_write_only_transaction_is_never_too_old(
    kv_store: KVStore, manual_clock: ManualClock
) -> None:
    tr = kv_store.create_transaction()
    tr.set(P + b"w", b"1")
    manual_clock.advance(30)
    tr.commit()
    assert read_all(kv_store) == {P + b"w": b"1"}


def test_run_recovers_from_too_old(kv_store: KVStore, manual_clock: ManualClock) -> None:
    attempts = []

    def slow(tr: KVTransaction) -> bytes | None:
        attempts.append(1)
        value = tr.get(P + b"a")
        if len(attempts) == 1:
            manual_clock.advance(6)
        tr.set(P + b"b", b"1")
        return value

    assert run(kv_store, slow) is None
    assert len(attempts) == 2


def test_timeout_raises_transaction_timed_out(kv_store: KVStore, manual_clock: ManualClock) -> None:
    tr = kv_store.create_transaction()
    tr.set_timeout(100)
    tr.get(P + b"a")
    manual_clock.advance(0.2)
    err = expect_code(TRANSACTION_TIMED_OUT, tr.get, P + b"a")
    assert not err.retryable
    with pytest.raises(KVError):
        tr.on_error(err)


def test_run_retries_retryable_errors(kv_store: KVStore) -> None:
    attempts = []

    def flaky(tr: KVTransaction) -> str:
        attempts.append(1)
        tr.set(P + b"attempt", b"%d" % len(attempts))
        if len(attempts) < 3:
            raise KVError(NOT_COMMITTED if len(attempts) == 1 else COMMIT_UNKNOWN_RESULT)
        return "done"

    assert run(kv_store, flaky) == "done"
    assert len(attempts) == 3
    assert read_all(kv_store) == {P + b"attempt": b"3"}  # earlier attempts' writes dropped


def test_run_reraises_non_retryable_errors(kv_store: KVStore) -> None:
    attempts = []

    def fatal(tr: KVTransaction) -> None:
        attempts.append(1)
        tr.set(P + b"x", b"1")
        raise KVError(TRANSACTION_TOO_LARGE)

    expect_code(TRANSACTION_TOO_LARGE, run, kv_store, fatal)
    assert len(attempts) == 1

    def broken(tr: KVTransaction) -> None:
        tr.set(P + b"y", b"1")
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError):
        run(kv_store, broken)
    assert read_all(kv_store) == {}  # nothing committed


def test_retry_limit_stops_the_loop(kv_store: KVStore) -> None:
    attempts = []

    def always_conflicts(tr: KVTransaction) -> None:
        tr.set_retry_limit(2)
        attempts.append(1)
        raise KVError(NOT_COMMITTED)

    expect_code(NOT_COMMITTED, run, kv_store, always_conflicts)
    assert len(attempts) == 3  # the first try and two retries


def test_run_inside_a_transaction_composes_without_commit(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    run(tr, lambda t: t.set(P + b"inner", b"1"))
    assert read_all(kv_store) == {}
    tr.commit()
    assert read_all(kv_store) == {P + b"inner": b"1"}


def test_read_only_commit_has_no_versionstamp(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.get(P + b"a")
    future = tr.get_versionstamp()
    tr.commit()
    with pytest.raises(KVError):
        future.result()


def test_reset_drops_buffered_writes(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.set(P + b"a", b"1")
    tr.reset()
    assert tr.get(P + b"a") is None
    tr.commit()
    assert read_all(kv_store) == {}


def test_versionstamped_key_then_clear_range_over_it_writes_nothing(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    tr.set_versionstamped_key(vs_key(P + b"log/"), b"x")
    tr.clear_range(P + b"log/", P + b"log0")
    tr.set(P + b"kept", b"1")
    tr.commit()
    assert read_all(kv_store) == {P + b"kept": b"1"}


def test_versions_increase_and_commit_follows_read(kv_store: KVStore) -> None:
    versions = []
    for i in range(3):
        tr = kv_store.create_transaction()
        read_version = tr.get_read_version()
        tr.set(P + b"v", b"%d" % i)
        tr.commit()
        get_committed_version = getattr(tr, "get_committed_version", None)
        if get_committed_version is None:
            pytest.skip("backend does not expose get_committed_version()")
        committed = get_committed_version()
        assert committed > read_version
        versions.append(committed)
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_write_conflict_range_conflicts_with_range_readers(kv_store: KVStore) -> None:
    reader = kv_store.create_transaction()
    assert reader.get_range(P + b"w/", P + b"w0") == []
    reader.set(P + b"out", b"x")
    run(kv_store, lambda tr: tr.add_write_conflict_range(P + b"w/m", P + b"w/n"))
    expect_code(NOT_COMMITTED, reader.commit)


def test_failed_commit_needs_on_error_before_reuse(kv_store: KVStore) -> None:
    key = P + b"k"
    tr = kv_store.create_transaction()
    tr.get(key)
    tr.set(key, b"mine")
    put(kv_store, {key: b"theirs"})
    err = expect_code(NOT_COMMITTED, tr.commit)
    tr.on_error(err)
    assert tr.get(key) == b"theirs"  # a fresh read version, writes dropped
    tr.set(key, b"mine")
    tr.commit()
    assert read_all(kv_store) == {key: b"mine"}


# What a star import brings into a test module: the suite, and its key prefix (to clear).
__all__ = ["P", *sorted(name for name in dict(globals()) if name.startswith("test_"))]
