"""The bytes a store compares to recognise a zone's pointer, idle, before it moves the
pointer's vesting time earlier at a commit (``records.idle_pointer_head``,
``kv.EarlierIfLater``, PostgreSQL's ``quick_pull3``): a record that starts with them is
that pointer's, not leased, and its vesting time follows as a msgpack uint64."""

from __future__ import annotations

import struct

import msgpack

from quickzones.store.records import (
    Pointer,
    ZoneId,
    decode_pointer,
    encode_pointer,
    idle_pointer_head,
)

NOW_MS = 1_796_572_924_713


def _pointer(**over: object) -> Pointer:
    fields: dict[str, object] = dict(
        pointer_id="0123456789abcdef",
        zone=ZoneId("shop", "tenant ¢vs \x02"),
        vesting_ms=NOW_MS,
        last_active_ms=NOW_MS - 5,
        local=False,
    )
    fields.update(over)
    return Pointer(**fields)  # type: ignore[arg-type]


def test_the_head_is_the_record_up_to_its_vesting_time() -> None:
    pointer = _pointer()
    record = encode_pointer(pointer)
    head = idle_pointer_head(record, pointer)
    assert head is not None
    assert record[len(head)] == 0xCF
    (vesting,) = struct.unpack(">Q", record[len(head) + 1 : len(head) + 9])
    assert vesting == NOW_MS
    assert msgpack.unpackb(record)["vs"] == NOW_MS


def test_the_same_idle_pointer_at_another_time_has_the_same_head() -> None:
    earlier, later = _pointer(vesting_ms=NOW_MS), _pointer(vesting_ms=NOW_MS + 3_600_000)
    head = idle_pointer_head(encode_pointer(earlier), earlier)
    assert head is not None
    assert encode_pointer(later).startswith(head)
    rewritten = encode_pointer(later)
    assert decode_pointer(b"k", rewritten).vesting_ms == NOW_MS + 3_600_000


def test_a_leased_record_or_another_pointer_does_not_start_with_it() -> None:
    pointer = _pointer()
    head = idle_pointer_head(encode_pointer(pointer), pointer)
    assert head is not None
    leased = _pointer(lease_id="L1", holder="worker-1")
    assert not encode_pointer(leased).startswith(head)  # a map of more entries
    other = _pointer(pointer_id="fedcba9876543210")
    assert not encode_pointer(other).startswith(head)
    assert idle_pointer_head(encode_pointer(leased), leased) is None


def test_a_vesting_time_not_packed_as_a_uint64_has_no_head() -> None:
    small = _pointer(vesting_ms=1_000)  # a test clock's time: msgpack packs it shorter
    assert idle_pointer_head(encode_pointer(small), small) is None
