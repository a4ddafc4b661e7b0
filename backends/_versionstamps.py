"""Versionstamps: the 10 bytes a commit writes into versionstamped keys and values."""

from __future__ import annotations

import struct

from quickzones.store.kv import INVALID_ARGUMENT, KVError

VERSIONSTAMP_SIZE = 10


def make_versionstamp(commit_version: int, batch_order: int = 0) -> bytes:
    """10 bytes: 8-byte big-endian commit version + 2-byte big-endian batch order."""
    return struct.pack(">QH", commit_version, batch_order)


def split_versionstamp_template(data: bytes, what: str) -> tuple[bytes, int]:
    """Strip the LE uint32 offset suffix (API >= 520); returns (body, offset)."""
    if len(data) < 4:
        raise KVError(INVALID_ARGUMENT, f"versionstamped {what} lacks its 4-byte offset suffix")
    (pos,) = struct.unpack("<I", data[-4:])
    body = data[:-4]
    if pos + VERSIONSTAMP_SIZE > len(body):
        raise KVError(
            INVALID_ARGUMENT,
            f"versionstamp offset {pos} + 10 exceeds the {what} length {len(body)}",
        )
    return body, pos


def fill_versionstamp(body: bytes, pos: int, stamp: bytes) -> bytes:
    return body[:pos] + stamp + body[pos + VERSIONSTAMP_SIZE :]
