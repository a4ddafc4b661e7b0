"""The PostgreSQL commit's lock plan finds key element boundaries from the key's bytes
(issue 42's cost: decoding each element was most of planning a commit's locks). The
boundaries must be exactly fdb.tuple's: every process, of this release or an older one,
must take the same locks for the same keys, or two commits that conflict would not meet.
"""

from __future__ import annotations

import random
import uuid

import pytest

from quickzones.backends.postgres import locks
from quickzones.store.tuple_layer import fdbtuple


def _decoded(key: bytes) -> tuple[tuple[int, ...], bool]:
    """The element boundaries as fdb.tuple's decoder finds them (the previous release's
    planner)."""
    ends = [0]
    pos = 0
    try:
        while pos < len(key):
            _, pos = fdbtuple._decode(key, pos)
            if pos < len(key):
                ends.append(pos)
    except Exception:
        return tuple(ends), False
    return tuple(ends), pos == len(key)


def _element(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(12 if depth < 2 else 11)
    if kind == 0:
        return None
    if kind == 1:
        return bytes(rng.choice(b"\x00\xff\x01a") for _ in range(rng.randrange(6)))
    if kind == 2:
        return "".join(rng.choice("a\x00\xffé€😀z") for _ in range(rng.randrange(6)))
    if kind in (3, 4):
        return rng.choice([0, 1, -1, 255, -256, 2**63, -(2**63)]) + rng.randrange(-3, 3)
    if kind == 5:
        return rng.randrange(-(2**200), 2**200)
    if kind == 6:
        return rng.random() * 1e6 - 5e5
    if kind == 7:
        return uuid.UUID(int=rng.getrandbits(128))
    if kind == 8:
        return rng.random() < 0.5
    if kind == 9:
        return b"\xff" * rng.randrange(3) + b"\x00"
    if kind == 10:
        return f"t{rng.randrange(10**6)}"
    return tuple(_element(rng, depth + 1) for _ in range(rng.randrange(4)))


def _keys(seed: int) -> list[bytes]:
    """Packed tuples of every element type, each cut at every length, and random bytes."""
    rng = random.Random(seed)
    keys: list[bytes] = []
    for _ in range(300):
        packed = fdbtuple.pack(tuple(_element(rng) for _ in range(rng.randrange(1, 7))))
        if rng.random() < 0.2:  # a versionstamp (code 0x33, 12 bytes), packed by hand
            packed += b"\x33" + bytes(rng.randrange(256) for _ in range(12))
        keys.extend(packed[:cut] for cut in range(len(packed) + 1))
        keys.append(packed + b"\x00")  # a range's end: key_after
        keys.append(packed + b"\xff")  # a prefix range's end
    for _ in range(2000):
        keys.append(bytes(rng.randrange(256) for _ in range(rng.randrange(12))))
    keys.append(b"\x02\xc3(\x00")  # a string that is not UTF-8
    keys.append(b"\x02ok\x00\x02\xe2\x82\x00\x15\x01")
    return keys


@pytest.mark.parametrize("seed", range(4))
def test_boundaries_are_fdb_tuple_element_boundaries(seed: int) -> None:
    for key in _keys(seed):
        assert locks._parsed.__wrapped__(key) == _decoded(key), key


def test_quick_keys_plan_the_same_locks_as_decoding() -> None:
    item = fdbtuple.pack(("quick", "z", "app", "tenant-\x00-1", "i", "01HZX3K9Q2M8"))
    order = fdbtuple.pack(("quick", "z", "app", "tenant-\x00-1", "x", 0, 1733134567890, "01H"))
    assert locks._parsed(item) == _decoded(item)
    assert locks._parsed(order) == _decoded(order)
    assert locks.boundaries(order)[-1] == len(order) - len(fdbtuple.pack(("01H",)))


def _previous_plan(
    reads: list[tuple[bytes, bytes]], writes: list[tuple[bytes, bytes]]
) -> tuple[list[int], list[bool]]:
    """The previous release's planner (one dict of prefix modes, fdb.tuple decoding):
    what a process of that release locks for the same commit."""

    def ancestors(key: bytes, length: int) -> list[bytes]:
        return [key[:cut] for cut in _decoded(key)[0] if cut < length]

    def take(modes: dict[bytes, bool], prefix: bytes, exclusive: bool) -> None:
        if exclusive or prefix not in modes:
            modes[prefix] = exclusive or modes.get(prefix, False)

    modes: dict[bytes, bool] = {}
    for ranges, write in ((reads, False), (writes, True)):
        for begin, end in ranges:
            if end == begin + b"\x00":
                for prefix in ancestors(begin, len(begin)):
                    take(modes, prefix, False)
                take(modes, begin, write)
            else:
                length = locks._anchor(begin, end)
                for prefix in ancestors(begin, length):
                    take(modes, prefix, False)
                take(modes, begin[:length], True)
    while len(modes) > locks.MOST_LOCKS:
        depth = {p: len(_decoded(p)[0]) + (1 if p else 0) for p in modes}
        deepest = max(depth.values())
        out: dict[bytes, bool] = {}
        for prefix, exclusive in modes.items():
            if depth[prefix] == deepest and prefix:
                out[prefix[: _decoded(prefix)[0][-1]]] = True
            elif exclusive or prefix not in out:
                out[prefix] = exclusive or out.get(prefix, False)
        modes = out
    merged: dict[int, bool] = {}
    for prefix, exclusive in modes.items():
        lock = locks._lock_id(prefix)
        merged[lock] = exclusive or merged.get(lock, False)
    order = sorted(merged)
    return order, [merged[i] for i in order]


@pytest.mark.parametrize("seed", range(3))
def test_plans_are_the_previous_releases(seed: int) -> None:
    """Points, ranges (prefix ranges, key_after ends, arbitrary ends), reads and writes
    of one key, and commits past MOST_LOCKS (escalated): the same locks and modes."""
    rng = random.Random(seed)
    zone = fdbtuple.pack(("quick", "z", "app", f"t{seed}"))
    pool = [zone + fdbtuple.pack(("i", f"id{n}")) for n in range(300)]
    pool += [zone + fdbtuple.pack(("x", 0, n, f"id{n}")) for n in range(300)]
    pool += [key for key in _keys(seed)[:400] if key]

    def ranges(count: int) -> list[tuple[bytes, bytes]]:
        out = []
        for _ in range(count):
            key = rng.choice(pool)
            shape = rng.randrange(4)
            if shape == 0:
                out.append((key, key + b"\x00"))
            elif shape == 1:
                out.append((key, key + b"\xff"))
            elif shape == 2:
                out.append((key, rng.choice(pool) + b"\x00"))
            else:
                out.append((key[: rng.randrange(len(key) + 1)], key + b"\x00"))
        return out

    for size in (1, 3, 10, 40, 150, 400):
        reads, writes = ranges(size), ranges(size)
        reads += writes[: size // 3]  # keys both read and written
        assert locks.plan(reads, writes) == _previous_plan(reads, writes)


def test_a_long_held_commit_that_read_single_keys_locks_its_single_key_writes_alone() -> None:
    """A commit into an application's transaction (held until its COMMIT) that read only
    single keys takes no lock on its writes' ancestors, so a consumer's range read of the
    zone does not wait for it; its reads keep theirs, and one that read a range, a clear,
    and quick's own commits plan as before."""
    zone = fdbtuple.pack(("quick", "z", "shop", "t"))
    index = fdbtuple.pack(("quick", "c", "default", 0, "ix", "shop", "t"))
    item = zone + fdbtuple.pack(("x", 0, 17, "id"))
    point = [(index, index + b"\x00")]
    write = [(item, item + b"\x00")]
    ids, modes = locks.plan(point, write, held_long=True)
    expected_ids, expected_modes = locks.plan(point, [])  # the read's locks, as always
    own = locks._lock_id(item)
    assert sorted([*expected_ids, own]) == ids
    before = dict(zip(expected_ids, expected_modes, strict=True))
    assert dict(zip(ids, modes, strict=True)) == {**before, own: True}
    # A range read, or a clear, among them: every ancestor as before.
    ranged = [*point, (zone + b"\x00", zone + b"\xff")]
    assert locks.plan(ranged, write, held_long=True) == locks.plan(ranged, write)
    clear = [*write, (zone + b"\x00", zone + b"\xff")]
    assert locks.plan(point, clear, held_long=True) != locks.plan(point, write, held_long=True)
    assert locks.plan(point, write) == _previous_plan(point, write)
