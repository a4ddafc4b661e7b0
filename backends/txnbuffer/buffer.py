"""The write buffer's entries: buffered point writes and versionstamped keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from quickzones.backends._atomics import AtomicOp
from quickzones.backends._ranges import Range

KeyValue = tuple[bytes, bytes]

# Kinds of buffered point writes. SET and CLEAR know the final value without storage;
# ATOMIC stacks ops on the value in storage; VS_VALUE is a versionstamped value (plus any
# atomic ops stacked on it), unreadable until commit.
_SET = 0
_CLEAR = 1
_ATOMIC = 2
_VS_VALUE = 3


@dataclass(slots=True)
class _Point:
    kind: int
    value: bytes | None
    seq: int
    vs_pos: int = 0
    ops: list[tuple[AtomicOp, bytes]] = field(default_factory=list)
    # A set (or atomic op) over a versionstamped value of this txn: FDB 7.3 keeps the key
    # unreadable until commit; only a clear makes it readable again.
    unreadable: bool = False


@dataclass(frozen=True, slots=True)
class _VersionstampedKey:
    body: bytes
    pos: int
    value: bytes
    seq: int
    unreadable: Range
