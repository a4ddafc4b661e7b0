"""The tenant-scale bench's big store built two ways (issue 43 point 4): by a consumer
(3.5 hours for a million tenants on the shared host) and through the store functions a
consumer calls (minutes). The fast build stands in for the slow one only if it leaves
the same store: the same keys (ids and times aside), the same counters and the same
dead letters."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from bench import tenant_store
from quickzones.client import Quick
from quickzones.store.admin import active_zones, count_dead_letters, list_dead_letters
from quickzones.store.tuple_layer import fdbtuple

TENANTS, SETTINGS = 200, 30

# The key parts that are ids or times (or a wait's bucket, a time too), by the key's
# kind: (root, "d", app, tenant, item_id) and (root, "m", name, ...) at these places.
_VARIES = {
    "d": (4,),
    "pickup": (4, 6),  # minute, bucket
    "pickup-app": (4, 5),  # minute, bucket
    "pickup-top": (4,),  # minute (the count stays: one pickup a tenant)
    "pickup-done": (3, 4),  # minute, flush id
    "errors": (4,),  # minute
    "runtime": (5, 6),  # window, bucket
    "clock": (),
}


def _shape(key: tuple[Any, ...]) -> tuple[Any, ...]:
    kind = key[1] if key[1] != "m" else key[2]
    varies = _VARIES.get(kind, ())
    return tuple("*" if n in varies else part for n, part in enumerate(key))


def _layout(path: Path) -> tuple[set[tuple[Any, ...]], Counter[tuple[Any, ...]]]:
    """The store's keys with their ids and times as ``*``, and its counters (8-byte
    little-endian values: atomic adds) summed by those keys."""
    shapes: set[tuple[Any, ...]] = set()
    counters: Counter[tuple[Any, ...]] = Counter()
    with sqlite3.connect(path) as con:
        for key, value in con.execute("SELECT key, value FROM kv"):
            shape = _shape(fdbtuple.unpack(key))
            shapes.add(shape)
            if shape[1] == "m" and shape[2] != "clock" and len(value) == 8:
                counters[shape] += int.from_bytes(value, "little", signed=True)
    return shapes, counters


def _letters(path: Path) -> dict[str, dict[str, Any]]:
    """Each tenant's dead letter, ids, times and the traceback's frames aside (the
    consumer's worker frames against the build's), its last line kept."""
    q = Quick.open(f"sqlite:///{path}")
    try:
        assert active_zones(q) == [] and count_dead_letters(q, "a") == TENANTS
        out = {}
        for letter in list_dead_letters(q, "a"):
            assert letter.item is not None and letter.traceback is not None
            item = dataclasses.asdict(letter.item)
            out[letter.zone.tenant] = {
                "reason": letter.reason,
                "traceback_last": letter.traceback.splitlines()[-1],
                **{k: v for k, v in item.items() if not (k.endswith("_ms") or "id" in k)},
            }
        return out
    finally:
        q.close()


def test_the_store_build_leaves_what_the_consumer_build_leaves(tmp_path: Path) -> None:
    built = {}
    for through in tenant_store.THROUGH:
        path = tmp_path / f"{through}.db"
        tenant_store.build(f"sqlite:///{path}", TENANTS, SETTINGS, through=through)
        built[through] = path
    store_keys, store_counters = _layout(built["store"])
    consumer_keys, consumer_counters = _layout(built["consumer"])
    assert store_keys == consumer_keys
    assert store_counters == consumer_counters
    # What the comparison stands on: a dead letter and a pickup a tenant, every
    # dead letter counted, no item, zone count or pointer of app a left.
    assert store_counters[("quick", "m", "dead-total", "a")] == TENANTS
    assert sum(n for k, n in store_counters.items() if k[2] == "pickup") == TENANTS
    assert not any(k[1] in ("z", "c") for k in store_keys)
    assert sum(k[1] == "d" for k in store_keys) == TENANTS
    letters = _letters(built["store"])
    assert letters == _letters(built["consumer"])
    assert {v["attempts"] for v in letters.values()} == {1}
    assert {v["error_count"] for v in letters.values()} == {1}


def test_the_build_refuses_an_unknown_way(tmp_path: Path) -> None:
    try:
        tenant_store.build(f"sqlite:///{tmp_path / 'x.db'}", 1, 0, through="hand")
    except ValueError as err:
        assert "through must be one of ('store', 'consumer'), not 'hand'" in str(err)
    else:
        raise AssertionError("an unknown way was accepted")
