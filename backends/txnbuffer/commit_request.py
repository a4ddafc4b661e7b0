"""What a commit hands the backend (:class:`CommitRequest`), what it resolves to
(:class:`ResolvedWrites`), and the versionstamp future that commit fills."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from quickzones.backends._atomics import AtomicOp, apply_atomic_stack
from quickzones.backends._ranges import Range, RangeSet
from quickzones.backends._versionstamps import fill_versionstamp, make_versionstamp
from quickzones.backends.txnbuffer.buffer import (
    _ATOMIC,
    _CLEAR,
    _SET,
    KeyValue,
    _Point,
    _VersionstampedKey,
)
from quickzones.backends.txnbuffer.checks import FUTURE_NOT_SET, NO_COMMIT_VERSION
from quickzones.store.kv import TRANSACTION_LIFETIME_S, KVError, KVTransaction, key_after

# kv.follow_in_commit: the transaction to follow, and whether it is needed given the
# values read after the commit (None: always).
Follower = tuple[
    Callable[[KVTransaction], None], Callable[[dict[bytes, bytes | None]], bool] | None
]


@dataclass(slots=True)
class ResolvedWrites:
    """Final mutations of a commit: clear ranges first, then sets and point deletes."""

    clears: list[Range]
    sets: list[KeyValue]
    deletes: list[bytes]
    # Write conflict ranges of versionstamped keys, known only once the stamp is.
    extra_write_conflicts: list[Range]


@dataclass(slots=True)
class CommitRequest:
    """Everything a backend needs to commit one transaction."""

    read_version: int | None
    read_time: float
    read_conflicts: list[Range]
    write_conflicts: list[Range]
    _points: dict[bytes, _Point]
    _cleared: RangeSet | None
    _clear_log: list[tuple[int, bytes, bytes]]
    _vs_keys: list[_VersionstampedKey]
    # Other processes' commit watchers are to hear of this commit at once, where the
    # store can tell them (kv.wake_watchers: a zone's pointer vests earlier).
    wakes_watchers: bool = False
    # Keys to read once the commit's writes are in place, in the commit's own round trip
    # where the backend can (KVTransaction.read_after_commit); it fills ``read_after_values``
    # (every key, None when absent) or leaves it None.
    read_after: list[bytes] = field(default_factory=list)
    read_after_values: dict[bytes, bytes | None] | None = None
    # Transactions to run and commit right after this one under the same hold of the
    # store's write lock, where the backend commits under one (kv.follow_in_commit).
    # Each with what decides whether it is needed from the read-after values (None: run).
    followers: list[Follower] = field(default_factory=list)

    def point_keys(self) -> Collection[bytes] | None:
        """The keys this commit writes, when each is a point write (no range cleared, no
        versionstamped key, whose keys are known only at commit); None otherwise."""
        if self._cleared is not None or self._vs_keys:
            return None
        return self._points.keys()

    def too_old(self, now: float) -> bool:
        """Whether the read version is past the 5 s lifetime (write-only txns never are)."""
        return self.read_version is not None and now - self.read_time > TRANSACTION_LIFETIME_S

    def atomic_keys(self) -> list[bytes]:
        """The keys whose final value needs the committed one (atomic ops over storage):
        the only keys :meth:`resolve` asks ``current`` about, so a backend can read them
        all at once beforehand."""
        return [key for key, point in self._points.items() if point.kind == _ATOMIC]

    def needs_version(self) -> bool:
        """Whether :meth:`resolve` needs the real versionstamp (a versionstamped key or
        value was written): without, a backend can resolve before knowing its version."""
        return bool(self._vs_keys) or any(
            point.kind not in (_SET, _CLEAR, _ATOMIC) for point in self._points.values()
        )

    def plain_adds(self) -> dict[bytes, bytes]:
        """The keys whose atomic ops over storage are all adds of one width, each with
        the sum of its operands (modulo that width): one add a backend can apply to the
        stored value itself, without reading it first."""
        adds: dict[bytes, bytes] = {}
        for key, point in self._points.items():
            if point.kind != _ATOMIC:
                continue
            if len(point.ops) == 1:  # the usual case: one add to a count
                op, param = point.ops[0]
                if op is AtomicOp.ADD:
                    adds[key] = param
                continue
            widths = {len(param) for _, param in point.ops}
            if len(widths) != 1 or any(op is not AtomicOp.ADD for op, _ in point.ops):
                continue
            n = widths.pop()
            total = sum(int.from_bytes(param, "little") for _, param in point.ops)
            adds[key] = (total % (1 << (8 * n))).to_bytes(n, "little")
        return adds

    def resolve(
        self,
        stamp: bytes,
        current: Callable[[bytes], bytes | None],
        skip: Collection[bytes] = (),
    ) -> ResolvedWrites:
        """Final writes given the versionstamp and the committed value of a key.

        ``current`` is only asked about keys with atomic ops over storage; it must return
        the value as of the commit version (before this transaction's writes). Keys in
        ``skip`` (atomic ones the backend applies itself, :meth:`plain_adds`) are left out.
        """
        final: dict[bytes, bytes | None] = {}
        for key, point in self._points.items():
            if key in skip:
                continue
            if point.kind == _SET or point.kind == _CLEAR:
                final[key] = point.value
            elif point.kind == _ATOMIC:
                final[key] = apply_atomic_stack(current(key), point.ops)
            else:
                assert point.value is not None
                stamped = fill_versionstamp(point.value, point.vs_pos, stamp)
                final[key] = apply_atomic_stack(stamped, point.ops)
        extra: list[Range] = []
        for vs in self._vs_keys:
            key = fill_versionstamp(vs.body, vs.pos, stamp)
            extra.append((key, key_after(key)))
            # Applied in issue order: a later point write or clear_range of the final key wins.
            later = self._points.get(key)
            if later is not None and later.seq > vs.seq:
                continue
            if any(s > vs.seq and b <= key < e for s, b, e in self._clear_log):
                continue
            final[key] = vs.value
        sets = [(k, v) for k, v in final.items() if v is not None]
        deletes = [k for k, v in final.items() if v is None]
        clears = [] if self._cleared is None else list(self._cleared)
        return ResolvedWrites(clears, sets, deletes, extra)


class _VersionstampFuture:
    """``tr.get_versionstamp()``: ready once the transaction commits."""

    __slots__ = ("_error", "_read_only", "_version")

    def __init__(self) -> None:
        # (commit version, batch order): the stamp is made from it when asked for, as
        # most commits (every enqueue's) never ask.
        self._version: tuple[int, int] | None = None
        self._error: KVError | None = None
        self._read_only = False

    def result(self) -> bytes:
        if self._version is not None:
            return make_versionstamp(*self._version)
        if self._error is not None:
            raise self._error
        if self._read_only:
            raise KVError(NO_COMMIT_VERSION, "read-only transaction")
        raise KVError(FUTURE_NOT_SET, "the versionstamp is ready only after commit")

    def _read_only_commit(self) -> None:
        """A read-only commit has no versionstamp. Its error is made only when asked for:
        most read-only commits (part two of an enqueue into an active zone, each cached
        setting's read) never ask, and making it cost a few % of an enqueue's CPU."""
        self._read_only = True

    def _set(self, version: int, batch_order: int) -> None:
        self._version = (version, batch_order)

    def _fail(self, error: KVError) -> None:
        self._error = error
