"""FoundationDB's atomic operations, applied to a stored value (docs/fdb-semantics.md section 3).

Shared by the memory and sqlite backends' transaction buffer, which stacks them until
commit and evaluates them against the value at the commit version.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from quickzones.store.kv import VALUE_SIZE_LIMIT


class AtomicOp(Enum):
    """FDB's atomic mutation types; values are the binding's method names."""

    ADD = "add"
    BIT_AND = "bit_and"
    BIT_OR = "bit_or"
    BIT_XOR = "bit_xor"
    MAX = "max"
    MIN = "min"
    BYTE_MAX = "byte_max"
    BYTE_MIN = "byte_min"
    APPEND_IF_FITS = "append_if_fits"
    COMPARE_AND_CLEAR = "compare_and_clear"


def _fit(value: bytes, n: int) -> bytes:
    """Zero-pad ``value`` to ``n`` bytes or keep its first ``n`` (FDB's operand fitting)."""
    if len(value) >= n:
        return value[:n]
    return value + b"\x00" * (n - len(value))


def _le(value: bytes) -> int:
    return int.from_bytes(value, "little")


def apply_atomic(op: AtomicOp, existing: bytes | None, param: bytes) -> bytes | None:
    """The value after applying ``op`` with ``param`` to ``existing`` (None = absent)."""
    n = len(param)
    if op is AtomicOp.ADD:
        # _fit and _le spelled out: every enqueue's count goes through here.
        stored = (existing or b"")[:n].ljust(n, b"\x00")
        total = int.from_bytes(stored, "little") + int.from_bytes(param, "little")
        return (total % (1 << (8 * n))).to_bytes(n, "little")
    if op is AtomicOp.BIT_OR:
        return (_le(_fit(existing or b"", n)) | _le(param)).to_bytes(n, "little")
    if op is AtomicOp.BIT_XOR:
        return (_le(_fit(existing or b"", n)) ^ _le(param)).to_bytes(n, "little")
    if op is AtomicOp.MAX:
        current = _fit(existing or b"", n)
        return param if _le(param) > _le(current) else current
    if existing is None and op is not AtomicOp.COMPARE_AND_CLEAR:
        # AND, MIN, BYTE_MIN, BYTE_MAX and APPEND_IF_FITS store the parameter on a missing key.
        return param
    if op is AtomicOp.BIT_AND:
        assert existing is not None
        return (_le(_fit(existing, n)) & _le(param)).to_bytes(n, "little")
    if op is AtomicOp.MIN:
        assert existing is not None
        current = _fit(existing, n)
        return param if _le(param) < _le(current) else current
    if op is AtomicOp.BYTE_MAX:
        assert existing is not None
        return max(existing, param)
    if op is AtomicOp.BYTE_MIN:
        assert existing is not None
        return min(existing, param)
    if op is AtomicOp.APPEND_IF_FITS:
        assert existing is not None
        joined = existing + param
        return joined if len(joined) <= VALUE_SIZE_LIMIT else existing
    # COMPARE_AND_CLEAR
    return None if existing == param else existing


def apply_atomic_stack(
    existing: bytes | None, ops: Iterable[tuple[AtomicOp, bytes]]
) -> bytes | None:
    value = existing
    for op, param in ops:
        value = apply_atomic(op, value, param)
    return value
